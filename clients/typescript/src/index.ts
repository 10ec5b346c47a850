// @fencelog/client: the fencelog daemon's HTTP API, typed from docs/openapi.json
// (src/schema.ts is generated from it: `npm run generate`), with the patterns a
// daemon otherwise writes by hand: an owner that heartbeats and says when it lost
// the subject, a supervised run reconciled by its request id, a watch that resumes.

import { randomUUID } from "node:crypto";
import createClient, { type Client } from "openapi-fetch";
import type { components, paths } from "./schema.js";

export type { components, paths };
export type Schemas = components["schemas"];
/** A problem document (RFC 9457) with the error's evidence, typed per `code`. */
export type Problem = Schemas["Problem"];
/** Every `code` an answer of the daemon may carry (docs/ERRORS.md). */
export type ProblemCode = Schemas["ProblemBase"]["code"];
/** The problem of one code, with that code's evidence members. */
export type ProblemOf<C extends ProblemCode> = Extract<Problem, { code: C }>;
export type ProcessView = Schemas["ProcessView"];
export type RunRequest = Schemas["RunRequest"];

/** Where the daemon is: a base URL, or a function asked before every request (a
 * successor after a cutover may listen elsewhere: read its `serve.addr`, say). */
export type BaseUrl = string | (() => string | Promise<string>);

export interface ClientOptions {
  baseUrl: BaseUrl;
  /** The contents of `serve.token` (write), `serve.read.token` or `serve.admin.token`. */
  token: string;
  /** A `fetch` to use instead of the global one. */
  fetch?: typeof fetch;
  /** Each request's bound in ms (default 80000: above the daemon's own 75 s). */
  requestTimeoutMs?: number;
}

/** An answer of the daemon that is a problem: its `code` is one of the document's. */
export class FencelogError extends Error {
  readonly code: ProblemCode;
  readonly status: number;
  readonly problem: Problem;
  /** The request id the daemon echoed (`Idempotency-Key`), if any. */
  readonly requestId: string | undefined;
  /** `Retry-After` in ms, on a 503. */
  readonly retryAfterMs: number | undefined;

  constructor(problem: Problem, response: Response) {
    super(`${problem.code}: ${problem.detail}`);
    this.name = "FencelogError";
    this.problem = problem;
    this.code = problem.code;
    this.status = response.status;
    this.requestId = response.headers.get("idempotency-key") ?? undefined;
    const retry = response.headers.get("retry-after");
    this.retryAfterMs = retry !== null && /^\d+$/.test(retry) ? Number(retry) * 1000 : undefined;
  }

  /** Is this the problem `code`? (Narrows `problem` to that code's evidence.) */
  is<C extends ProblemCode>(code: C): this is FencelogError & { code: C; problem: ProblemOf<C> } {
    return this.code === code;
  }
}

/** Why an owner's `signal` was aborted. */
export class OwnershipLost extends Error {
  constructor(
    /** `FENCED` or `NOT_ACTIVE`: the daemon refused a heartbeat (another owner has
     * the subject, or it was released); `HEARTBEAT_TIMEOUT`: no heartbeat landed
     * within the staleness, so another may take over now; `RELEASED`: released here. */
    readonly code: "FENCED" | "NOT_ACTIVE" | "HEARTBEAT_TIMEOUT" | "RELEASED",
    readonly subject: string,
    readonly generation: number,
    readonly cause?: unknown,
  ) {
    super(`${subject} generation ${generation}: ${code}`);
    this.name = "OwnershipLost";
  }
}

const sleep = (ms: number, signal?: AbortSignal) =>
  new Promise<void>((resolve) => {
    if (signal?.aborted) return resolve();
    const t = setTimeout(done, ms);
    function done() {
      clearTimeout(t);
      signal?.removeEventListener("abort", done);
      resolve();
    }
    signal?.addEventListener("abort", done, { once: true });
  });

/** A problem document, or a FencelogError-shaped one made from what came instead. */
function asProblem(body: unknown, response: Response): Problem {
  if (typeof body === "object" && body !== null && "code" in body && typeof (body as { code: unknown }).code === "string") {
    return body as Problem;
  }
  return {
    type: "urn:fencelog:problem:io_error",
    title: "IO_ERROR",
    status: response.status,
    detail: `an answer that is not a problem document (HTTP ${response.status})`,
    code: "IO_ERROR",
  } as Problem;
}

/** The data of an answer, or its problem thrown as a FencelogError. */
function unwrap<T>(r: { data?: T; error?: unknown; response: Response }): T {
  if (r.response.ok && r.data !== undefined) return r.data;
  throw new FencelogError(asProblem(r.error, r.response), r.response);
}

/** A failure after which a mutation's outcome is not known: the answer was lost
 * (network), or the daemon says so (`REQUEST_TIMEOUT`, `ETCD_UNAVAILABLE`). */
function outcomeUnknown(e: unknown): boolean {
  if (e instanceof FencelogError) return e.code === "REQUEST_TIMEOUT" || e.code === "ETCD_UNAVAILABLE";
  return true;
}

/** A failure after which the same request may simply be sent again (it is known
 * not to have landed, or it carries its request id). */
function retryable(e: unknown): boolean {
  if (e instanceof FencelogError) {
    return ["NOT_COMMITTED", "OVERLOADED", "CUTOVER_IN_PROGRESS", "REQUEST_TIMEOUT", "ETCD_UNAVAILABLE"].includes(e.code);
  }
  return true;
}

export interface ClaimOptions {
  subject: string;
  /** The heartbeat is judged stale after this long; heartbeats go every quarter of it. */
  staleAfterMs: number;
  /** This owner's instance (default: a new UUID). */
  instance?: string;
}

export interface TakeoverOptions extends ClaimOptions {
  reason?: string;
}

/** One record of a watch stream (`inspect dump --json` without its location). */
export interface WatchRecord {
  seq: number;
  time_ms: number;
  time: string;
  writer: string;
  link: string;
  bytes: number;
  /** The request id, if the transaction carried one (absent if it does not decode). */
  request?: string | null;
  kinds: string[];
  subjects?: string[];
  conditions?: Record<string, unknown>[];
  events?: Array<{ kind: string } & Record<string, unknown>>;
  error?: string | null;
  payload_bytes?: number | null;
}

export interface WatchOptions {
  /** The first sequence to yield (1: the whole log). Default: only new records. */
  from?: number;
  signal?: AbortSignal;
  /** Consecutive failed connections before the watch throws (default 30; any
   * answered connection starts the count again). */
  attemptsMax?: number;
}

/** A client of one daemon (or of its successors, through a `baseUrl` function). */
export class Fencelog {
  /** Typed calls of every operation: `api.POST("/v1/claim", {body, headers})`, … */
  readonly api: Client<paths>;
  readonly ownership: { claim(o: ClaimOptions): Promise<Owner>; takeover(o: TakeoverOptions): Promise<Owner> };
  private readonly options: ClientOptions;
  private readonly fetchImpl: typeof fetch;

  constructor(options: ClientOptions) {
    this.options = options;
    this.fetchImpl = options.fetch ?? globalThis.fetch;
    const timeoutMs = options.requestTimeoutMs ?? 80_000;
    this.api = createClient<paths>({
      // Resolved per request (below): a successor may listen elsewhere.
      baseUrl: "http://fencelog.invalid",
      headers: { authorization: `Bearer ${options.token}` },
      fetch: async (request: Request) => {
        const url = new URL(request.url);
        const base = (await this.baseUrl()).replace(/\/+$/, "");
        const body = request.body === null ? undefined : await request.arrayBuffer();
        const signal = AbortSignal.any([request.signal, AbortSignal.timeout(timeoutMs)]);
        return this.fetchImpl(new Request(base + url.pathname + url.search, { method: request.method, headers: request.headers, body, signal }));
      },
    });
    this.ownership = {
      claim: (o) => this.claim(o),
      takeover: (o) => this.takeover(o),
    };
  }

  /** The daemon's base URL now. */
  async baseUrl(): Promise<string> {
    const b = this.options.baseUrl;
    return typeof b === "string" ? b : await b();
  }

  /** Claim `subject` and keep it: the owner heartbeats every quarter of
   * `staleAfterMs` until `release()`, and aborts its `signal` when it loses it. */
  async claim(o: ClaimOptions): Promise<Owner> {
    const instance = o.instance ?? randomUUID();
    let sentAt = Date.now();
    const answer = await this.mutation("claim", (key) => ((sentAt = Date.now()),
      this.api.POST("/v1/claim", {
        body: { subject: o.subject, instance, stale_after_ms: o.staleAfterMs },
        headers: { "Idempotency-Key": key },
      })),
    );
    return new Owner(this, o.subject, answer.generation, instance, o.staleAfterMs, sentAt);
  }

  /** Take `subject` over from a stale owner: the expectation sent is exactly the
   * generation and heartbeat the state shows now, so a takeover that raced with a
   * heartbeat or another takeover is refused (`TAKEOVER_RACE`), never applied. */
  async takeover(o: TakeoverOptions): Promise<Owner> {
    const state = unwrap(await this.api.GET("/v1/state", { params: { query: { subject: o.subject } } }));
    const current = state.subjects[0];
    if (current === undefined || current.heartbeat_ms === null || current.heartbeat_ms === undefined) {
      throw new Error(`${o.subject} has no owner to take over: claim it`);
    }
    const instance = o.instance ?? randomUUID();
    const body = {
      subject: o.subject,
      expect_generation: current.generation,
      expect_heartbeat_ms: current.heartbeat_ms,
      instance,
      stale_after_ms: o.staleAfterMs,
      reason: o.reason ?? "",
    };
    let sentAt = Date.now();
    const answer = await this.mutation("takeover", (key) => (
      (sentAt = Date.now()), this.api.POST("/v1/takeover", { body, headers: { "Idempotency-Key": key } })
    ));
    return new Owner(this, o.subject, answer.generation, instance, o.staleAfterMs, sentAt);
  }

  /** Send a mutation under one request id until its outcome is known: a lost
   * answer is asked of the log (`GET /v1/requests/{id}`): committed, its outcome is
   * the answer; never committed, the request is sent again (same id). */
  async mutation<T>(
    what: string,
    send: (requestId: string) => Promise<{ data?: T; error?: unknown; response: Response }>,
    requestId: string = randomUUID(),
    attemptsMax = 20,
  ): Promise<T> {
    let last: unknown;
    for (let attempt = 0; attempt < attemptsMax; attempt++) {
      try {
        return unwrap(await send(requestId));
      } catch (e) {
        last = e;
        if (!retryable(e)) throw e;
        if (outcomeUnknown(e)) {
          const known = await this.askTheLog(requestId);
          if (known.status === "committed") {
            const outcome = known.outcomes[0];
            if (outcome === undefined) {
              throw new Error(`${what}: request ${requestId} committed at ${known.seq}, its outcome no longer retained`, { cause: e });
            }
            return { ...outcome, seq: known.seq, deduplicated: true, request_id: requestId } as T;
          }
        }
        await sleep(e instanceof FencelogError ? (e.retryAfterMs ?? 1000) : 250);
      }
    }
    throw new Error(`${what}: no answer after ${attemptsMax} attempts (request id ${requestId})`, { cause: last });
  }

  /** What the log says of a request id, asked until it answers (bounded): never
   * guessed from a failure to ask. */
  private async askTheLog(requestId: string): Promise<Schemas["RequestShowResponse"]> {
    let last: unknown;
    for (let attempt = 0; attempt < 60; attempt++) {
      try {
        return await this.requestStatus(requestId);
      } catch (e) {
        last = e;
        if (e instanceof FencelogError && !retryable(e)) throw e;
        await sleep(e instanceof FencelogError ? (e.retryAfterMs ?? 1000) : 500);
      }
    }
    throw new Error(`could not ask the log about request ${requestId}`, { cause: last });
  }

  /** What became of a request id, from the log. */
  async requestStatus(requestId: string): Promise<Schemas["RequestShowResponse"]> {
    return unwrap(await this.api.GET("/v1/requests/{id}", { params: { path: { id: requestId } } }));
  }

  /** Run a command under supervision, once: its request id makes a lost answer
   * (a dropped connection, `OUTCOME_UNKNOWN` at a cutover) a question to the log
   * — did the spawn intent land, which process is it — never a second run. */
  async run(req: RunRequest & { request_id?: string }): Promise<ProcessView> {
    const requestId = req.request_id ?? randomUUID();
    for (let attempt = 0; attempt < 20; attempt++) {
      try {
        return unwrap(await this.api.POST("/v1/run", { body: { ...req, request_id: requestId } }));
      } catch (e) {
        const reconcile = !(e instanceof FencelogError) || e.is("OUTCOME_UNKNOWN") || outcomeUnknown(e);
        if (!reconcile) {
          // Known not to have landed (NOT_COMMITTED, OVERLOADED, a cutover): the
          // same request id again; anything else is the answer.
          if (!retryable(e)) throw e;
        } else {
          const known = await this.askTheLog(requestId);
          if (known.status === "committed") {
            const spawn = known.outcomes.find((o) => o.kind === "spawn_recorded");
            if (spawn !== undefined && spawn.kind === "spawn_recorded") return this.process(spawn.process);
            // Committed, but its outcomes aged out of the log's request table: find
            // the process by its request id; never run it again.
            const all = unwrap(await this.api.GET("/v1/processes"));
            const mine = all.processes.find((p) => p.request_id === requestId);
            if (mine !== undefined) return mine;
            throw new Error(`run: request ${requestId} committed at ${known.seq}, its process not found`, { cause: e });
          }
        }
        // Not in the log: the same request id again.
        await sleep(e instanceof FencelogError ? (e.retryAfterMs ?? 1000) : 250);
      }
    }
    throw new Error(`run: no answer after 20 attempts (request id ${requestId})`);
  }

  /** One process (a process left without its runner is settled first). */
  async process(id: number): Promise<ProcessView> {
    return unwrap(await this.api.GET("/v1/processes/{id}", { params: { path: { id } } }));
  }

  /** Wait (at most `timeoutMs`, ≤ 60000 per request) for a process to end. */
  async wait(id: number, timeoutMs = 30_000): Promise<ProcessView> {
    return unwrap(await this.api.POST("/v1/processes/{id}/wait", { params: { path: { id } }, body: { timeout_ms: timeoutMs } }));
  }

  /** Committed records, each exactly once, in order: resumes with `Last-Event-ID`
   * across dropped connections, a daemon's cutover (to the successor the
   * `baseUrl` names) and restarts, waiting `Retry-After` when told to. */
  async *watch(o: WatchOptions = {}): AsyncGenerator<WatchRecord, void, undefined> {
    let last: number | undefined = o.from !== undefined ? Math.max(o.from, 1) - 1 : undefined;
    let failures = 0;
    const attemptsMax = o.attemptsMax ?? 30;
    while (!o.signal?.aborted) {
      let waitMs = 1000;
      // A connection silent for two keep-alive intervals is dead: dropped, resumed.
      const connection = new AbortController();
      let idle: NodeJS.Timeout | undefined;
      const alive = () => {
        clearTimeout(idle);
        idle = setTimeout(() => connection.abort(new Error("the watch stream went silent")), WATCH_SILENCE_MS);
      };
      try {
        const headers: Record<string, string> = { authorization: `Bearer ${this.options.token}`, accept: "text/event-stream" };
        if (last !== undefined) headers["last-event-id"] = String(last);
        alive();
        const signal = o.signal ? AbortSignal.any([o.signal, connection.signal]) : connection.signal;
        const response = await this.fetchImpl(`${(await this.baseUrl()).replace(/\/+$/, "")}/v1/watch`, { headers, signal });
        if (!response.ok || response.body === null) {
          const problem = asProblem(await response.json().catch(() => undefined), response);
          const e = new FencelogError(problem, response);
          if (response.status !== 503) throw e;
          waitMs = e.retryAfterMs ?? waitMs;
          throw Object.assign(e, { transient: true });
        }
        failures = 0;
        for await (const ev of sseEvents(response.body, alive)) {
          if (ev.retry !== undefined) waitMs = ev.retry;
          if (ev.event === "record" && ev.id !== undefined) {
            const seq = Number(ev.id);
            if (last !== undefined && seq <= last) continue;
            last = seq;
            yield JSON.parse(ev.data) as WatchRecord;
          } else if (ev.event === undefined && ev.id !== undefined && last === undefined) {
            // The opening message: where a stream from the head starts.
            last = Number(ev.id);
          } else if (ev.event === "cutover") {
            break;
          } else if (ev.event === "error") {
            throw new WatchEnded(ev.data, last);
          }
        }
      } catch (e) {
        if (o.signal?.aborted) return;
        if (e instanceof WatchEnded) throw e;
        if (e instanceof FencelogError && !(e as { transient?: boolean }).transient) throw e;
        if (++failures >= attemptsMax) throw e;
      } finally {
        clearTimeout(idle);
      }
      await sleep(waitMs, o.signal);
    }
  }
}

/** Two keep-alive intervals of the daemon's (15 s): a watch connection silent this
 * long is taken for dead. */
const WATCH_SILENCE_MS = 30_000;

/** The daemon ended a watch stream with an `error` event: a record it could not
 * read or show. Resuming would meet it again. */
export class WatchEnded extends Error {
  constructor(
    readonly detail: string,
    /** The last sequence yielded before it. */
    readonly lastSeq: number | undefined,
  ) {
    super(`the watch stream ended: ${detail}`);
    this.name = "WatchEnded";
  }
}

/** An owner of a subject: heartbeats until released or lost; `signal` is aborted
 * with an `OwnershipLost` reason the moment it is no longer the owner. Its
 * staleness is counted, as the daemon counts it, from when its last landed
 * heartbeat (or its claim) was sent: a deadline timer aborts the signal then,
 * whether or not a heartbeat is in flight. */
export class Owner {
  readonly signal: AbortSignal;
  private readonly controller = new AbortController();
  private timer: NodeJS.Timeout | undefined;
  private deadline: NodeJS.Timeout | undefined;
  private stopped = false;
  private beating: Promise<void> | undefined;

  constructor(
    private readonly client: Fencelog,
    readonly subject: string,
    public generation: number,
    readonly instance: string,
    readonly staleAfterMs: number,
    /** When the claim that made this owner was sent. */
    private lastOkMs: number,
  ) {
    this.signal = this.controller.signal;
    this.arm();
    this.schedule();
  }

  private arm() {
    clearTimeout(this.deadline);
    const left = this.lastOkMs + this.staleAfterMs - Date.now();
    this.deadline = setTimeout(() => this.lose("HEARTBEAT_TIMEOUT"), Math.max(0, left));
  }

  private schedule() {
    if (this.stopped || this.signal.aborted) return;
    this.timer = setTimeout(() => {
      this.beating = this.beat().finally(() => this.schedule());
    }, Math.max(1, Math.floor(this.staleAfterMs / 4)));
  }

  private lose(code: OwnershipLost["code"], cause?: unknown) {
    this.stopped = true;
    clearTimeout(this.timer);
    clearTimeout(this.deadline);
    if (this.signal.aborted) return;
    this.controller.abort(new OwnershipLost(code, this.subject, this.generation, cause));
  }

  /** One heartbeat now. */
  async beat(): Promise<void> {
    if (this.stopped || this.signal.aborted) return;
    const sentAt = Date.now();
    const left = this.lastOkMs + this.staleAfterMs - sentAt;
    try {
      const r = await this.client.api.POST("/v1/heartbeat", {
        body: { subject: this.subject, generation: this.generation, instance: this.instance },
        headers: { "Idempotency-Key": randomUUID() },
        signal: AbortSignal.timeout(Math.max(1, left)),
      });
      unwrap(r);
      if (this.stopped || this.signal.aborted) return;
      this.lastOkMs = sentAt;
      this.arm();
    } catch (e) {
      if (e instanceof FencelogError && (e.code === "FENCED" || e.code === "NOT_ACTIVE")) {
        return this.lose(e.code, e);
      }
      // Anything else (the daemon unreachable, overloaded): the next beat tries
      // again; the deadline timer says when it is too late.
    }
  }

  /** Stop heartbeating and release the subject (its signal is aborted: `RELEASED`). */
  async release(): Promise<void> {
    this.stopped = true;
    clearTimeout(this.timer);
    await this.beating?.catch(() => undefined);
    clearTimeout(this.timer);
    clearTimeout(this.deadline);
    if (this.signal.aborted) {
      const reason = this.signal.reason as OwnershipLost;
      if (reason.code !== "RELEASED") throw reason;
      return;
    }
    this.controller.abort(new OwnershipLost("RELEASED", this.subject, this.generation));
    await this.client.mutation("release", (key) =>
      this.client.api.POST("/v1/release", {
        body: { subject: this.subject, generation: this.generation, instance: this.instance },
        headers: { "Idempotency-Key": key },
      }),
    );
  }
}

interface SseEvent {
  event?: string;
  id?: string;
  data: string;
  retry?: number;
}

/** The events of a `text/event-stream` body (comments skipped). */
async function* sseEvents(body: ReadableStream<Uint8Array>, alive: () => void): AsyncGenerator<SseEvent> {
  const decoder = new TextDecoder();
  let buffer = "";
  let ev: SseEvent = { data: "" };
  let hasData = false;
  let touched = false;
  for await (const chunk of body as unknown as AsyncIterable<Uint8Array>) {
    alive(); // keep-alive comments count
    buffer += decoder.decode(chunk, { stream: true });
    let nl: number;
    while ((nl = buffer.search(/\r?\n/)) >= 0) {
      const line = buffer.slice(0, nl);
      buffer = buffer.slice(nl + (buffer[nl] === "\r" ? 2 : 1));
      if (line === "") {
        if (touched) yield ev;
        ev = { data: "" };
        hasData = false;
        touched = false;
        continue;
      }
      if (line.startsWith(":")) continue;
      const colon = line.indexOf(":");
      const field = colon < 0 ? line : line.slice(0, colon);
      const value = colon < 0 ? "" : line.slice(colon + 1).replace(/^ /, "");
      touched = true;
      if (field === "data") {
        ev.data = hasData ? `${ev.data}\n${value}` : value;
        hasData = true;
      } else if (field === "event") ev.event = value;
      else if (field === "id") ev.id = value;
      else if (field === "retry" && /^\d+$/.test(value)) ev.retry = Number(value);
    }
  }
}

/** A client of the daemon at `baseUrl` with `token`. */
export function connect(options: ClientOptions): Fencelog {
  return new Fencelog(options);
}
