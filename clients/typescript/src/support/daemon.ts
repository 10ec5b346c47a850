// A real `fencelog serve` for the tests: a child process on a free loopback port,
// its log in a fresh directory.

import { spawn, type ChildProcess } from "node:child_process";
import { mkdtempSync, readFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { createInterface } from "node:readline";
import { connect, type Fencelog } from "../index.js";

/** The binary cargo built (FENCELOG_BIN overrides). */
export const BIN = process.env.FENCELOG_BIN ?? resolve(import.meta.dirname, "../../../../target/debug/fencelog");

export interface Daemon {
  dir: string;
  child: ChildProcess;
  url: string;
  token: string;
  exited: Promise<number | null>;
}

/** A fresh log directory. */
export function freshDir(): string {
  return join(mkdtempSync(join(tmpdir(), "fencelog-ts-")), "log");
}

/** Start a daemon on `dir` and wait for its ready line (bounded: 60 s). */
export async function serve(dir: string, ...extra: string[]): Promise<Daemon> {
  const child = spawn(BIN, ["serve", "--dir", dir, "--listen", "127.0.0.1:0", ...extra], {
    stdio: ["ignore", "pipe", "inherit"],
  });
  const exited = new Promise<number | null>((r) => child.on("exit", (code) => r(code)));
  const lines = createInterface({ input: child.stdout! });
  const ready = new Promise<string>((resolveLine, reject) => {
    lines.once("line", resolveLine);
    child.once("exit", (code) => reject(new Error(`fencelog serve exited ${code} before it was ready`)));
    setTimeout(() => reject(new Error("fencelog serve was not ready within 60 s")), 60_000).unref();
  });
  const line = JSON.parse(await ready) as { listening: string };
  const token = readFileSync(join(dir, "serve.token"), "utf8").trim();
  return { dir, child, url: `http://${line.listening}`, token, exited };
}

/** The address the daemon now serving `dir` wrote (a successor's after a cutover). */
export function addrOf(dir: string): string {
  return `http://${readFileSync(join(dir, "serve.addr"), "utf8").trim()}`;
}

export function client(d: Daemon, token = d.token): Fencelog {
  return connect({ baseUrl: d.url, token });
}

export async function stop(d: Daemon): Promise<void> {
  if (d.child.exitCode === null && d.child.signalCode === null) {
    d.child.kill("SIGKILL");
    await d.exited;
  }
}

/** Poll `check` until it returns a value (bounded: the condition, not a time, is
 * what a test waits for; the bound only ends a test that would hang). */
export async function until<T>(what: string, check: () => Promise<T | undefined>, boundMs = 60_000): Promise<T> {
  const t0 = Date.now();
  for (;;) {
    const v = await check();
    if (v !== undefined) return v;
    if (Date.now() - t0 > boundMs) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}
