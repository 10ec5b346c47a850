// @fencelog/client's patterns against a real daemon: an owner's heartbeats and its
// signal, an exact takeover, a run reconciled by its request id, typed errors.

import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { after, before, test } from "node:test";
import { connect, FencelogError, OwnershipLost } from "../index.js";
import { client, freshDir, serve, stop, until, type Daemon } from "../support/daemon.js";

let d: Daemon;
before(async () => {
  d = await serve(freshDir());
});
after(async () => stop(d));

/** The owner's signal's reason, once it is aborted (bounded: 60 s, so a
 * regression fails instead of hanging). */
const aborted = (signal: AbortSignal) =>
  new Promise<OwnershipLost>((resolve, reject) => {
    if (signal.aborted) return resolve(signal.reason as OwnershipLost);
    const t = setTimeout(() => reject(new Error("the signal was not aborted within 60 s")), 60_000);
    signal.addEventListener("abort", () => (clearTimeout(t), resolve(signal.reason as OwnershipLost)), { once: true });
  });

test("an owner heartbeats on its own and its signal says FENCED when another rotates the fence", async () => {
  const fl = client(d);
  const owner = await fl.ownership.claim({ subject: "svc/a", staleAfterMs: 800 });
  assert.equal(owner.generation, 1);
  // Heartbeats land: the state's heartbeat moves on by itself.
  const first = await fl.api.GET("/v1/state", { params: { query: { subject: "svc/a" } } });
  const t0 = first.data?.subjects[0]?.heartbeat_ms ?? 0;
  await until("a heartbeat", async () => {
    const s = await fl.api.GET("/v1/state", { params: { query: { subject: "svc/a" } } });
    const hb = s.data?.subjects[0]?.heartbeat_ms ?? 0;
    return hb > t0 ? hb : undefined;
  });
  assert.equal(owner.signal.aborted, false);
  // Someone else moves the generation on: this owner is fenced out.
  const rotated = await connect({ baseUrl: d.url, token: d.token }).api.POST("/v1/rotate-fence", {
    body: { subject: "svc/a", generation: 1 },
  });
  assert.equal(rotated.data?.generation, 2);
  const reason = await aborted(owner.signal);
  assert.ok(reason instanceof OwnershipLost);
  assert.equal(reason.code, "FENCED");
  assert.equal(reason.generation, 1);
  assert.ok(reason.cause instanceof FencelogError && reason.cause.is("FENCED"));
});

test("release ends the heartbeats and frees the subject; a later heartbeat is NOT_ACTIVE", async () => {
  const fl = client(d);
  const owner = await fl.ownership.claim({ subject: "svc/b", staleAfterMs: 2_000 });
  await owner.release();
  assert.equal((owner.signal.reason as OwnershipLost).code, "RELEASED");
  const s = await fl.api.GET("/v1/state", { params: { query: { subject: "svc/b" } } });
  assert.equal(s.data?.subjects[0]?.status, "free");
  const late = await fl.api.POST("/v1/heartbeat", { body: { subject: "svc/b", generation: owner.generation } });
  assert.equal(late.error?.code, "NOT_ACTIVE");
});

test("takeover of a stale owner names exactly what it saw; the old owner is then FENCED with how it was retired", async () => {
  const fl = client(d);
  // An owner that stops heartbeating (a remote one: only a takeover replaces it).
  const old = await fl.api.POST("/v1/claim", { body: { subject: "svc/c", stale_after_ms: 300 } });
  assert.ok(old.data);
  await until("the owner to go stale", async () => {
    const s = await fl.api.GET("/v1/state", { params: { query: { subject: "svc/c" } } });
    return s.data?.subjects[0]?.status === "stale" ? true : undefined;
  });
  const owner = await fl.ownership.takeover({ subject: "svc/c", staleAfterMs: 5_000, reason: "stale in test" });
  assert.equal(owner.generation, 2);
  const fenced = await fl.api.POST("/v1/heartbeat", { body: { subject: "svc/c", generation: old.data.generation } });
  const problem = fenced.error;
  assert.ok(problem && problem.code === "FENCED");
  assert.equal(problem.current, 2);
  assert.equal(problem.retired?.how.kind, "taken_over");
  await owner.release();
});

test("an owner whose heartbeats cannot land within its staleness is told HEARTBEAT_TIMEOUT", async () => {
  const own = await serve(freshDir());
  const fl = client(own);
  const owner = await fl.ownership.claim({ subject: "svc/d", staleAfterMs: 1_000 });
  await stop(own); // kill -9: nothing answers any more
  const reason = await aborted(owner.signal);
  assert.equal(reason.code, "HEARTBEAT_TIMEOUT");
});

test("errors are one typed class: the code and its evidence", async () => {
  const fl = client(d);
  const owner = await fl.ownership.claim({ subject: "svc/e", staleAfterMs: 30_000 });
  await assert.rejects(fl.ownership.claim({ subject: "svc/e", staleAfterMs: 30_000 }), (e: unknown) => {
    assert.ok(e instanceof FencelogError);
    assert.equal(e.status, 409);
    if (!e.is("ALREADY_ACTIVE")) return false;
    assert.equal(e.problem.subject, "svc/e");
    assert.equal(e.problem.generation, 1);
    assert.ok(e.requestId);
    return true;
  });
  const read = connect({ baseUrl: d.url, token: "not-this-daemons-token-at-all" });
  await assert.rejects(read.process(1), (e: unknown) => e instanceof FencelogError && e.code === "UNAUTHENTICATED");
  await owner.release();
});

test("a run whose answer is lost is reconciled through its request id: one process, never a second run", async () => {
  let dropped = 0;
  let runs = 0;
  let asked = 0;
  // The first answer to POST /v1/run is lost after the daemon handled it.
  const lossy: typeof fetch = async (input, init) => {
    const r = await fetch(input, init);
    const url = input instanceof Request ? input.url : String(input);
    const method = input instanceof Request ? input.method : (init?.method ?? "GET");
    if (method === "POST" && url.endsWith("/v1/run")) runs++;
    if (method === "GET" && url.includes("/v1/requests/")) asked++;
    if (method === "POST" && url.endsWith("/v1/run") && dropped === 0) {
      dropped++;
      await r.arrayBuffer();
      throw new TypeError("fetch failed (the answer was lost)");
    }
    return r;
  };
  const fl = connect({ baseUrl: d.url, token: d.token, fetch: lossy });
  const marker = `ran-${randomUUID()}`;
  const requestId = `run-${randomUUID()}`;
  const p = await fl.run({ command: ["sh", "-c", `echo ${marker}`], request_id: requestId, wait_ms: 0 });
  assert.equal(dropped, 1);
  assert.equal(runs, 1, "the run was sent once: its outcome came from the log, not a second POST");
  assert.ok(asked >= 1, "the log was asked about the request id");
  assert.equal(p.request_id, requestId);
  const done = await fl.wait(p.id);
  assert.equal(done.status, "succeeded");
  const all = await fl.api.GET("/v1/processes");
  const mine = all.data?.processes.filter((x) => x.request_id === requestId) ?? [];
  assert.equal(mine.length, 1, "the command ran once");
  const known = await fl.requestStatus(requestId);
  assert.equal(known.status, "committed");
});
