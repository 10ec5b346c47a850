// The watch as an async iterator: every record exactly once, in order, across a
// daemon's cutover to a successor (which listens elsewhere) and a kill -9 and restart.

import assert from "node:assert/strict";
import { test } from "node:test";
import { connect, type WatchRecord } from "../index.js";
import { addrOf, client, freshDir, serve, stop, until } from "../support/daemon.js";

test("a watch from 1 yields each record once across a cutover and a kill -9 restart", async () => {
  const dir = freshDir();
  const a = await serve(dir);
  const token = a.token;
  // The successor's address is in serve.addr: the client asks before each connection.
  const fl = connect({ baseUrl: () => addrOf(dir), token });
  const controller = new AbortController();
  const seen: WatchRecord[] = [];
  const watching = (async () => {
    for await (const r of fl.watch({ from: 1, signal: controller.signal })) seen.push(r);
  })();
  const claimOn = async (subject: string) => {
    const r = await fl.api.POST("/v1/claim", { body: { subject, stale_after_ms: 60_000 } });
    assert.ok(r.data, JSON.stringify(r.error));
    return r.data.seq ?? 0;
  };
  const s1 = await claimOn("w/1");
  await until("the first claim in the watch", async () => (seen.some((r) => r.seq === s1) ? true : undefined));

  // A successor takes over: the first daemon cuts over and exits.
  const b = await serve(dir, "--handover");
  assert.equal(await a.exited, 0);
  const s2 = await claimOn("w/2");
  await until("a record appended after the cutover", async () => (seen.some((r) => r.seq === s2) ? true : undefined));

  // kill -9 of the successor, and a restart on the same directory.
  await stop(b);
  const c = await serve(dir);
  const s3 = await claimOn("w/3");
  await until("a record appended after the restart", async () => (seen.some((r) => r.seq === s3) ? true : undefined));

  controller.abort();
  await watching;
  const head = await client(c).api.GET("/v1/head");
  const last = head.data?.seq ?? 0;
  const seqs = seen.map((r) => r.seq).filter((s) => s <= last);
  // Every record from 1 to the head, each once, in order.
  assert.deepEqual(seqs, Array.from({ length: seqs.length }, (_, i) => i + 1));
  assert.ok(seqs.length >= s3, `${seqs.length} records seen, the last claim at ${s3}`);
  assert.ok(seen.some((r) => r.kinds.includes("cutover")), "the cutover record itself is in the stream");
  await stop(c);
});

test("a watch without from starts at the head: only new records", async () => {
  const d = await serve(freshDir());
  const fl = client(d);
  await fl.api.POST("/v1/claim", { body: { subject: "old", stale_after_ms: 60_000 } });
  const controller = new AbortController();
  const seen: WatchRecord[] = [];
  const watching = (async () => {
    for await (const r of fl.watch({ signal: controller.signal })) {
      seen.push(r);
      if (r.subjects?.some((x) => x.startsWith("new-"))) controller.abort();
    }
  })();
  // The stream has started once a record appended now is seen; append until then.
  // A fresh subject each time: each claim is a new record.
  let i = 0;
  await until("a new record in the stream", async () => {
    await fl.api.POST("/v1/claim", { body: { subject: `new-${i++}`, stale_after_ms: 60_000 } });
    return seen.length > 0 ? true : undefined;
  });
  await watching;
  assert.ok(seen.every((r) => !(r.subjects ?? []).includes("old")), "nothing before the head");
  await stop(d);
});

test("a watch told 503 with Retry-After (every stream slot taken) waits and connects once a slot frees", async () => {
  const d = await serve(freshDir());
  // Take every watch slot of the daemon (64) with streams of our own.
  const hogs = new AbortController();
  const held: Response[] = [];
  for (;;) {
    const r = await fetch(`${d.url}/v1/watch`, { headers: { authorization: `Bearer ${d.token}` }, signal: hogs.signal });
    if (r.status === 503) {
      assert.equal(r.headers.get("retry-after"), "1");
      await r.body?.cancel();
      break;
    }
    assert.equal(r.status, 200);
    held.push(r);
    assert.ok(held.length <= 64, "the daemon bounds its watch streams");
  }
  let attempts = 0;
  const counting: typeof fetch = async (input, init) => {
    const url = input instanceof Request ? input.url : String(input);
    if (url.includes("/v1/watch")) attempts++;
    return fetch(input, init);
  };
  const watcher = connect({ baseUrl: d.url, token: d.token, fetch: counting });
  const controller = new AbortController();
  const first = (async () => {
    for await (const r of watcher.watch({ from: 1, signal: controller.signal })) {
      controller.abort();
      return r;
    }
    return undefined;
  })();
  // The watch was refused at least once; then the slots free up.
  await until("the watch to be refused", async () => (attempts >= 1 ? true : undefined));
  hogs.abort();
  const r = await first;
  assert.equal(r?.seq, 1);
  assert.ok(attempts >= 2, `it connected again after the 503 (${attempts} attempts)`);
  await stop(d);
});
