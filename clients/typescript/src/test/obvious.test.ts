// The program a new user writes the obvious way against the generated types
// (openapi-fetch + src/schema.d.ts): it must type-check under `strict` with no cast
// (`npm run build`), and run against a real daemon.

import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { after, before, test } from "node:test";
import createClient from "openapi-fetch";
import type { paths } from "../schema.js";
import { freshDir, serve, stop, type Daemon } from "../support/daemon.js";

let d: Daemon;
before(async () => {
  d = await serve(freshDir());
});
after(async () => stop(d));

test("claim, heartbeat, state, run, wait, logs and a refusal's evidence, typed with no cast", async () => {
  const api = createClient<paths>({ baseUrl: d.url, headers: { Authorization: `Bearer ${d.token}` } });
  const instance = randomUUID();

  const claimed = await api.POST("/v1/claim", {
    body: { subject: "jobs/nightly", instance, stale_after_ms: 30_000 },
    headers: { "Idempotency-Key": randomUUID() },
  });
  assert.ok(claimed.data, JSON.stringify(claimed.error));
  const generation: number = claimed.data.generation;
  assert.equal(claimed.data.kind, "claimed");
  assert.equal(generation, 1);

  const beat = await api.POST("/v1/heartbeat", { body: { subject: "jobs/nightly", generation } });
  assert.ok(beat.data);
  assert.equal(beat.data.generation, generation);

  const state = await api.GET("/v1/state", { params: { query: { subject: "jobs/nightly" } } });
  assert.ok(state.data);
  assert.equal(state.data.subjects[0]?.status, "active");
  assert.equal(state.data.subjects[0]?.owner?.instance, instance);

  const run = await api.POST("/v1/run", { body: { command: ["sh", "-c", "echo out; echo err >&2"], leases: ["db:write"] } });
  assert.ok(run.data, JSON.stringify(run.error));
  const id: number = run.data.id;

  const waited = await api.POST("/v1/processes/{id}/wait", { params: { path: { id } }, body: { timeout_ms: 30_000 } });
  assert.ok(waited.data);
  assert.equal(waited.data.status, "succeeded");
  assert.equal(waited.data.exit_code, 0);

  const logs = await api.GET("/v1/processes/{id}/logs", { params: { path: { id }, query: { stream: "stderr" } }, parseAs: "text" });
  assert.equal(logs.data, "err\n");

  // A second claim of the held subject: refused, with the holder as evidence.
  const refused = await api.POST("/v1/claim", { body: { subject: "jobs/nightly", stale_after_ms: 30_000 } });
  assert.equal(refused.response.status, 409);
  assert.ok(refused.error);
  const problem = refused.error;
  assert.equal(problem.code, "ALREADY_ACTIVE");
  if (problem.code === "ALREADY_ACTIVE") {
    const holder: string = problem.instance;
    const held: number = problem.generation;
    assert.equal(holder, instance);
    assert.equal(held, generation);
  }
  // The request id of a refusal is on its answer too.
  assert.ok(refused.response.headers.get("idempotency-key"));
});
