/**
 * Client: one Channel to a broker, kept open, behind one API whatever the transport.
 *
 * State machine (the `state` event reports each change):
 *
 *     connecting ──► open ───────(socket lost)──► reconnecting ──► connecting ...
 *          │                                            ▲
 *          └─(no WebSocket)─► long-poll ──(lost)────────┘
 *                                 │
 *                                 └─(a WebSocket opens again)──► open
 *
 * A connection attempt tries a WebSocket first; when it does not open (a proxy
 * refusing the upgrade, no greeting within `openTimeout`), it falls back to
 * HTTP long-poll at once, and from there tries a WebSocket again every
 * `upgradeInterval`. A lost connection is retried after an exponential
 * backoff with full jitter (a delay drawn from 0 to min(max, initial·2^n),
 * the scheme centrifuge-js uses, 0.5 to 20 s by default). A long-poll attempt
 * the broker turned away with 503 or 429 waits its `Retry-After` (capped at a
 * minute) before that delay; a WebSocket attempt cannot: a browser's WebSocket API
 * shows neither the status nor the headers of a refused handshake.
 *
 * A WebSocket Channel is resumed when the connection comes back
 * (docs/protocol.md, "Resuming a Channel"): the Client opens `/asbp?resume=<i>`
 * with the secret of the greeting and the count of frames it received, and
 * the broker (any broker of the bus) sends what was routed to the Channel
 * meanwhile, in order and once: a `channel` event with `resumed: true` (and a
 * `gap` event only when the log's retention dropped some). When the broker
 * cannot resume it (expired, resume off) or the Channel was on long-poll, the
 * reconnection is a new Channel: `resumed: false` and a `gap` event. Then
 * the Client restores what did not follow: what `asbp.resumed` names in
 * `kept` followed the Channel (`subscriptions`: every topic and queue
 * subscription; `subjects`: the Subjects it lists in `subjects`), and the
 * rest is subscribed again, or signed in again with the credentials it first
 * used (those stay with the connection that made them), so that handles stay
 * valid. A new Channel restores everything.
 * Requests in flight when a WebSocket Channel that can resume drops wait for
 * the resume: their answers were routed to the Channel and are replayed with
 * everything else. They fail with ConnectionLost only when it is not resumed
 * (a new Channel: 2110, 2113), when the Client is closed, or at their own
 * timeout. On long-poll they fail at once. They are never repeated, since the
 * Client cannot know whether they ran, with one exception: a broker that stops
 * (a rolling restart: close 1012, fault 2114) says how many frames it acted on
 * (`read=<n>`), and the Client resumes at once, without the backoff delay, and
 * sends the ones after the n-th again there, first and in order (it keeps the
 * last 4,096 frames sent on a connection for that).
 */

import { Command, DEFAULT_LIMITS, MAX_COMMAND_ID, type HeaderInput, type Limits } from "./codec.js";
import { decode } from "./codec.js";
import { AsbpError, ConnectionLost, FaultError, TimeoutError } from "./errors.js";
import {
  openLongPoll,
  openWebSocket,
  type FetchLike,
  type OpenInfo,
  type ResumeFrom,
  type Transport,
  type WebSocketLike,
} from "./transports.js";

export type State = "connecting" | "open" | "reconnecting" | "long-poll" | "closed";
export type TransportKind = "websocket" | "long-poll";
export type Body = Uint8Array | string;

export interface ClientOptions {
  /** The transports to use, in order of preference (default both). */
  transports?: readonly TransportKind[];
  /** Reconnection delays in milliseconds: full jitter over initial·2^n, capped at max. */
  backoff?: { initial?: number; max?: number };
  /** A request's default timeout in milliseconds (30 000). */
  timeout?: number;
  /** Milliseconds to wait for a WebSocket's greeting before falling back (5 000). */
  openTimeout?: number;
  /** Milliseconds on long-poll between attempts to go back to a WebSocket (30 000). */
  upgradeInterval?: number;
  /** Seconds one long-poll may wait at the broker (25, the broker's maximum). */
  longPollWait?: number;
  /** The WebSocket constructor (default: the global one). */
  WebSocket?: WebSocketLike;
  /** The fetch function (default: the global one). */
  fetch?: FetchLike;
  /** The codec's limits (default: the broker's defaults). */
  limits?: Limits;
  /** A source of numbers in [0, 1) for the jitter (default Math.random). */
  random?: () => number;
}

export interface RequestOptions {
  /** Milliseconds before the request fails with TimeoutError (the Client's `timeout`). */
  timeout?: number;
  /** Aborts the request: the promise rejects with the signal's reason. */
  signal?: AbortSignal;
  /** More header keys (`m`, `e`, extension keys). */
  keys?: Readonly<Record<string, HeaderInput | undefined>>;
}

export interface ChannelEvent {
  id: string;
  transport: TransportKind;
  /** Whether the broker kept the previous Channel (a WebSocket Channel resumed). */
  resumed: boolean;
}

export interface GapEvent {
  previous: string;
  current: string;
  reason: string;
}

interface Events {
  state: State;
  channel: ChannelEvent;
  gap: GapEvent;
  /** A Command no request or subscription was waiting for (a delivery with `d` or `g`). */
  command: Command;
  error: Error;
}

type Listener<T> = (value: T) => void;

interface Pending {
  /** Takes one Command carrying this `u`; returns true when the exchange is over. */
  take(command: Command): boolean;
  fail(error: Error): void;
}

/** A fault Command as an error. */
export function faultOf(command: Command): FaultError {
  return new FaultError(Number(command.get("code") ?? 0), command.text(), command.get("cause"));
}

const isFault = (command: Command): boolean => command.name === "asbp.fault";

/** Commands kept while no Channel is open, at most. */
export const MAX_QUEUED = 1024;

/** An async queue: what an iterator over a stream or a subscription reads. */
class Inbox<T> implements AsyncIterableIterator<T> {
  private items: T[] = [];
  private waiting: ((result: IteratorResult<T>) => void) | undefined;
  private failWaiting: ((error: unknown) => void) | undefined;
  private ended = false;
  private error: unknown;
  constructor(private readonly onReturn: () => void = () => {}) {}

  push(item: T): void {
    if (this.ended) return;
    const waiting = this.waiting;
    if (waiting) {
      this.waiting = this.failWaiting = undefined;
      waiting({ value: item, done: false });
    } else this.items.push(item);
  }

  end(error?: unknown): void {
    if (this.ended) return;
    this.ended = true;
    this.error = error;
    const [waiting, fail] = [this.waiting, this.failWaiting];
    this.waiting = this.failWaiting = undefined;
    if (error !== undefined) fail?.(error);
    else waiting?.({ value: undefined, done: true });
  }

  next(): Promise<IteratorResult<T>> {
    if (this.items.length) return Promise.resolve({ value: this.items.shift()!, done: false });
    if (this.ended) {
      if (this.error !== undefined) {
        const error = this.error;
        this.error = undefined;
        return Promise.reject(error);
      }
      return Promise.resolve({ value: undefined, done: true });
    }
    return new Promise((resolve, reject) => {
      this.waiting = resolve;
      this.failWaiting = reject;
    });
  }

  return(): Promise<IteratorResult<T>> {
    this.onReturn();
    this.end();
    this.items = [];
    return Promise.resolve({ value: undefined, done: true });
  }

  [Symbol.asyncIterator](): AsyncIterableIterator<T> {
    return this;
  }
}

/** A signed-in Subject: its requests carry its `s`, routed to the agents that authenticated it. */
export class Subject {
  /** `s`, the Subject-Identifier (a new one after each reconnection). */
  id: string;
  roles: readonly string[];
  /** `p`, the Conversation-Address the agent gave, if any. */
  address: string | undefined;
  /** `a`, the agent that authenticated the Subject. */
  agent: string | undefined;
  signedIn = true;

  constructor(
    private readonly client: Client,
    readonly command: string,
    readonly credentials: Body,
    answer: Command,
  ) {
    this.id = "";
    this.roles = [];
    this.update(answer);
  }

  /** @internal */
  update(answer: Command): void {
    this.id = answer.get("s") ?? "";
    const roles = answer.header.get("roles");
    this.roles = roles === undefined ? [] : typeof roles === "string" ? [roles] : roles;
    this.address = answer.get("p");
    this.agent = answer.get("a");
  }

  /** `client.request` as this Subject (an Authenticated-Command). */
  request(name: string, body?: Body, options: RequestOptions = {}): Promise<Command> {
    return this.client.request(name, body, this.asSubject(options));
  }

  /** `client.stream` as this Subject. */
  stream(name: string, body?: Body, options: RequestOptions = {}): AsyncIterableIterator<Command> {
    return this.client.stream(name, body, this.asSubject(options));
  }

  /** End the Subject (`asbp.logout`). */
  async signOut(options: RequestOptions = {}): Promise<void> {
    this.signedIn = false;
    this.client.forget(this);
    await this.client.request("asbp.logout", undefined, this.asSubject(options));
  }

  private asSubject(options: RequestOptions): RequestOptions {
    // A function of the moment of sending: after a reconnection, `s` is new.
    return { ...options, keys: { ...options.keys, s: this.id } };
  }
}

export type DestinationType = "TOPIC" | "QUEUE" | "VIRTUAL_QUEUE";

/** One subscription: read it with `for await`, or give `subscribe` a callback. */
export class Subscription implements AsyncIterable<Command> {
  /** @internal */
  readonly inbox: Inbox<Command>;
  active = true;

  constructor(
    private readonly client: Client,
    readonly destination: string,
    readonly type: DestinationType,
    /** @internal */
    readonly callback: ((notification: Command) => void) | undefined,
  ) {
    this.inbox = new Inbox<Command>(() => void this.unsubscribe().catch(() => {}));
  }

  /** @internal */
  deliver(notification: Command): void {
    if (this.callback) this.callback(notification);
    else this.inbox.push(notification);
  }

  /** End the subscription (`asbp.unsubscribe`). */
  async unsubscribe(): Promise<void> {
    if (!this.active) return;
    this.active = false;
    this.inbox.end();
    this.client.drop(this);
    if (this.client.state === "open" || this.client.state === "long-poll") {
      await this.client.request("asbp.unsubscribe", undefined, {
        keys: { destination: this.destination, type: this.type },
      });
    }
  }

  [Symbol.asyncIterator](): AsyncIterator<Command> {
    return this.inbox;
  }
}

const subscriptionKey = (type: string, destination: string): string => `${type} ${destination}`;

export class Client {
  /** Where the Client is; `state` events report each change. */
  state: State = "closed";
  /** The current Channel-Identifier `i`, while connected. */
  channelId: string | undefined;
  /** The transport in use, while connected. */
  transport: TransportKind | undefined;

  private readonly wsUrl: string;
  private readonly httpUrl: string;
  private readonly options: Required<Omit<ClientOptions, "WebSocket" | "fetch" | "backoff">> & {
    backoff: { initial: number; max: number };
  };
  private readonly WebSocketImpl: WebSocketLike | undefined;
  private readonly fetchImpl: FetchLike | undefined;
  private readonly listeners = new Map<keyof Events, Set<Listener<never>>>();
  private readonly pending = new Map<number, Pending>();
  private readonly subscriptions = new Map<string, Subscription>();
  private readonly subjects = new Set<Subject>();
  private outbox: (() => Command)[] = [];
  private current: Transport | undefined;
  private probe: Transport | undefined;
  private nextId = 0;
  private attempt = 0;
  private timer: ReturnType<typeof setTimeout> | undefined;
  private upgradeTimer: ReturnType<typeof setTimeout> | undefined;
  private wanted = false;
  private everOpened = false;
  private lostReason = "";
  /** The WebSocket Channel's secret, to resume it (never logged), and the frames
   * received after its greeting. */
  private secret: string | undefined;
  private received = 0;
  /** Whether queue deliveries count too: the broker did not say `count=2` back to
   * the `count=2` every WebSocket sends (one from before it logs them). */
  private countsDeliveries = true;
  /** Frames a stopping broker did not act on (its 1012 said `read=<n>`), sent first
   * where the Channel resumes. */
  private unread: Uint8Array<ArrayBuffer>[] = [];
  private opening: { resolve: () => void; reject: (e: Error) => void }[] = [];

  /**
   * @param url the broker's `/asbp`: `ws(s)://` or `http(s)://` (the other is
   *   derived), or a path resolved against the page's address in a browser.
   */
  constructor(url: string, options: ClientOptions = {}) {
    const base = (globalThis as { location?: { href: string } }).location?.href;
    const parsed = new URL(url, base);
    const secure = parsed.protocol === "wss:" || parsed.protocol === "https:";
    parsed.protocol = secure ? "wss:" : "ws:";
    this.wsUrl = parsed.href;
    parsed.protocol = secure ? "https:" : "http:";
    this.httpUrl = parsed.href;
    this.options = {
      transports: options.transports ?? ["websocket", "long-poll"],
      backoff: { initial: options.backoff?.initial ?? 500, max: options.backoff?.max ?? 20_000 },
      timeout: options.timeout ?? 30_000,
      openTimeout: options.openTimeout ?? 5_000,
      upgradeInterval: options.upgradeInterval ?? 30_000,
      longPollWait: options.longPollWait ?? 25,
      limits: options.limits ?? DEFAULT_LIMITS,
      random: options.random ?? Math.random,
    };
    this.WebSocketImpl = options.WebSocket ?? (globalThis as { WebSocket?: WebSocketLike }).WebSocket;
    this.fetchImpl = options.fetch ?? (globalThis.fetch ? globalThis.fetch.bind(globalThis) : undefined);
  }

  // -- events ------------------------------------------------------------

  /** Listen to an event; returns the function that stops listening. */
  on<K extends keyof Events>(event: K, listener: Listener<Events[K]>): () => void {
    let set = this.listeners.get(event);
    if (!set) this.listeners.set(event, (set = new Set()));
    set.add(listener as Listener<never>);
    return () => set!.delete(listener as Listener<never>);
  }

  private emit<K extends keyof Events>(event: K, value: Events[K]): void {
    for (const listener of this.listeners.get(event) ?? []) {
      try {
        (listener as Listener<Events[K]>)(value);
      } catch (error) {
        if (event !== "error") this.emit("error", error as Error);
      }
    }
  }

  private setState(state: State): void {
    if (this.state === state) return;
    this.state = state;
    this.emit("state", state);
  }

  // -- connection --------------------------------------------------------

  /** Connect (and stay connected until `close`); resolves once a Channel is open. */
  connect(): Promise<void> {
    if (this.state === "open" || this.state === "long-poll") return Promise.resolve();
    const opened = new Promise<void>((resolve, reject) => this.opening.push({ resolve, reject }));
    if (!this.wanted) {
      this.wanted = true;
      this.attempt = 0;
      this.start();
    }
    return opened;
  }

  /** Close the Channel and stop reconnecting; requests in flight fail with ConnectionLost. */
  close(): void {
    this.wanted = false;
    clearTimeout(this.timer);
    clearTimeout(this.upgradeTimer);
    this.probe?.close();
    this.probe = undefined;
    const transport = this.current;
    this.current = undefined;
    transport?.close();
    this.lost("the client was closed");
    for (const { reject } of this.opening.splice(0)) reject(new ConnectionLost("the client was closed"));
    this.setState("closed");
  }

  private start(): void {
    this.setState(this.everOpened ? "reconnecting" : "connecting");
    const kinds = this.options.transports;
    const kind = kinds[0] ?? "websocket";
    const resume =
      kind === "websocket" && this.secret !== undefined && this.channelId !== undefined
        ? { channelId: this.channelId, secret: this.secret, received: this.received }
        : undefined;
    this.open(kind, 0, resume);
  }

  private open(kind: TransportKind, index: number, resume?: ResumeFrom): void {
    let transport: Transport | undefined;
    let opened = false;
    const guard =
      kind === "websocket"
        ? setTimeout(() => transport?.close(), this.options.openTimeout)
        : undefined;
    const events = {
      open: (channelId: string, info?: OpenInfo) => {
        clearTimeout(guard);
        opened = true;
        this.adopt(transport!, channelId, info);
      },
      frame: (frame: Uint8Array) => {
        if (this.current === transport) this.receive(frame);
      },
      close: (
        _ever: boolean,
        reason: string,
        refused?: boolean,
        unread?: Uint8Array<ArrayBuffer>[],
        retryAfter?: number,
      ) => {
        clearTimeout(guard);
        if (this.current !== transport && opened) return; // replaced by an upgrade
        // Its broker is stopping (1012): what it did not read goes first where the
        // Channel resumes, and that is tried at once, without the backoff delay.
        if (unread !== undefined) this.unread = unread;
        if (refused && this.wanted) {
          // No Channel to resume: a new one, at once.
          this.secret = undefined;
          this.open(kind, index);
          return;
        }
        const next = this.options.transports[index + 1];
        if (!opened && next !== undefined && this.wanted) {
          // This transport never opened: the next one, at once (the fallback).
          this.open(next, index + 1);
          return;
        }
        if (this.current === transport) this.current = undefined;
        // A WebSocket Channel that can resume keeps its requests: their answers
        // come with the replay (or they fail when a new Channel opens instead).
        this.lost(reason, kind === "websocket" && this.wanted && this.secret !== undefined);
        if (this.wanted) this.retry(unread !== undefined, retryAfter);
      },
    };
    try {
      transport =
        kind === "websocket"
          ? openWebSocket(this.wsUrl, events, this.requireWebSocket(), this.options.limits, resume)
          : openLongPoll(this.httpUrl, events, this.requireFetch(), this.options.limits, this.options.longPollWait);
    } catch (error) {
      queueMicrotask(() => events.close(false, String(error)));
    }
  }

  private requireWebSocket(): WebSocketLike {
    if (!this.WebSocketImpl) throw new AsbpError(2107, "no WebSocket here: pass options.WebSocket");
    return this.WebSocketImpl;
  }

  private requireFetch(): FetchLike {
    if (!this.fetchImpl) throw new AsbpError(2107, "no fetch here: pass options.fetch");
    return this.fetchImpl;
  }

  private retry(now = false, retryAfter = 0): void {
    const { initial, max } = this.options.backoff;
    // A broker that turned the attempt away (long-poll: 503, 429) said when to come
    // back: at least that, with the jittered backoff on top so that its clients do
    // not all return at the same instant.
    const delay = now ? 0 : retryAfter + this.options.random() * Math.min(max, initial * 2 ** this.attempt);
    this.attempt = now ? this.attempt : Math.min(this.attempt + 1, 30);
    this.setState("reconnecting");
    this.timer = setTimeout(() => {
      if (this.wanted) this.start();
    }, delay);
  }

  /** A transport opened a Channel: it becomes the current one. */
  private adopt(transport: Transport, channelId: string, info?: OpenInfo): void {
    const previous = this.channelId;
    const resumed = info?.resumed === true && channelId === previous;
    this.secret = transport.kind === "websocket" ? (resumed ? this.secret : info?.secret) : undefined;
    this.received = resumed ? (info?.received ?? 0) : 0;
    this.countsDeliveries = info?.countsDeliveries ?? true;
    const old = this.current;
    this.current = transport;
    this.channelId = channelId;
    this.transport = transport.kind;
    this.attempt = 0;
    if (old && old !== transport) {
      // An upgrade from long-poll: the old Channel goes, its requests with it.
      old.close();
      this.lost("moved to a WebSocket");
    }
    this.setState(transport.kind === "websocket" ? "open" : "long-poll");
    this.emit("channel", { id: channelId, transport: transport.kind, resumed });
    if (this.everOpened && previous !== undefined) {
      if (!resumed) {
        // The answers owed to the old Channel will never come.
        this.failPending(new ConnectionLost(`connection lost: ${this.lostReason || "a new Channel"}`));
        this.emit("gap", { previous, current: channelId, reason: this.lostReason || "reconnected" });
      } else if (info?.lost) this.emit("gap", { previous, current: channelId, reason: `${info.lost} Commands lost` });
      this.restore(resumed ? (info?.kept ?? []) : [], resumed ? (info?.subjects ?? []) : []);
    }
    this.everOpened = true;
    // What the stopping broker did not read, before anything else; for that Channel
    // only: on a new one their requests have failed above.
    const unread = this.unread.splice(0);
    if (resumed && transport.sendFrame) for (const frame of unread) transport.sendFrame(frame);
    const queued = this.outbox.splice(0);
    for (const make of queued) this.write(make());
    for (const { resolve } of this.opening.splice(0)) resolve();
    clearTimeout(this.upgradeTimer);
    if (transport.kind === "long-poll" && this.options.transports.includes("websocket")) this.scheduleUpgrade();
  }

  /** On long-poll: try a WebSocket now and then, and move to it when one opens. */
  private scheduleUpgrade(): void {
    this.upgradeTimer = setTimeout(() => {
      if (!this.wanted || this.transport !== "long-poll" || this.probe) return;
      let probe: Transport | undefined;
      const guard = setTimeout(() => probe?.close(), this.options.openTimeout);
      const done = (): void => {
        clearTimeout(guard);
        if (this.probe === probe) this.probe = undefined;
      };
      try {
        probe = this.probe = openWebSocket(
          this.wsUrl,
          {
            open: (channelId, info) => {
              done();
              this.adopt(probe!, channelId, info);
            },
            frame: (frame) => {
              if (this.current === probe) this.receive(frame);
            },
            close: (opened, reason) => {
              done();
              if (this.current === probe) {
                this.current = undefined;
                this.lost(reason);
                if (this.wanted) this.retry();
              } else if (!opened && this.transport === "long-poll") this.scheduleUpgrade();
            },
          },
          this.requireWebSocket(),
          this.options.limits,
        );
      } catch {
        done();
        this.scheduleUpgrade();
      }
    }, this.options.upgradeInterval);
  }

  /** The connection is gone: fail what was in flight, unless the Channel may resume
   * (`keep`), which replays their answers. */
  private lost(reason: string, keep = false): void {
    this.lostReason = reason;
    if (!keep) this.failPending(new ConnectionLost(`connection lost: ${reason}`));
  }

  private failPending(error: Error): void {
    const pending = [...this.pending.values()];
    this.pending.clear();
    for (const entry of pending) entry.fail(error);
  }

  /** After a reconnection: subscribe again and sign in again what did not follow the
   * Channel (`kept` and `keptSubjects` of `asbp.resumed`; nothing on a new Channel). */
  private restore(kept: readonly string[], keptSubjects: readonly string[]): void {
    const subscriptionsKept = kept.includes("subscriptions");
    const subjectsKept = kept.includes("subjects") ? new Set(keptSubjects) : new Set<string>();
    for (const subscription of this.subscriptions.values()) {
      if (subscriptionsKept) break;
      this.request("asbp.subscribe", undefined, {
        keys: { destination: subscription.destination, type: subscription.type },
      }).catch((error: Error) => this.emit("error", error));
    }
    for (const subject of this.subjects) {
      if (subjectsKept.has(subject.id)) continue;
      this.request(subject.command, subject.credentials)
        .then((answer) => subject.update(answer))
        .catch((error: Error) => {
          subject.signedIn = false;
          this.subjects.delete(subject);
          this.emit("error", error);
        });
    }
  }

  private write(command: Command): void {
    try {
      this.current!.send(command);
    } catch (error) {
      this.emit("error", error as Error);
    }
  }

  /**
   * Send when connected, or queue until a Channel opens. The queue is bounded
   * (MAX_QUEUED): past it, the Command is refused with fault 2105 rather than
   * let a page that keeps sending while offline grow without end.
   */
  private dispatch(make: () => Command): void {
    if (this.current && (this.state === "open" || this.state === "long-poll")) this.write(make());
    else if (this.outbox.length >= MAX_QUEUED) {
      throw new AsbpError(2105, `${MAX_QUEUED} Commands already wait for a connection`);
    } else this.outbox.push(make);
  }

  /** Take a Command that was never sent out of the queue (its request was abandoned). */
  private unqueue(make: () => Command): void {
    const at = this.outbox.indexOf(make);
    if (at !== -1) this.outbox.splice(at, 1);
  }

  // -- frames in -----------------------------------------------------------

  private receive(frame: Uint8Array): void {
    let command: Command;
    try {
      command = decode(frame, this.options.limits);
    } catch (error) {
      this.received += 1; // the broker logged it: it logs every frame but queue deliveries
      this.emit("error", error as Error);
      return;
    }
    // A queue delivery (a notification with a receipt) is not in the Channel's log
    // when the broker said count=2: the queue is its log, and delivers it again
    // after a resume (docs/protocol.md, "Resuming a Channel").
    if (this.countsDeliveries || command.name !== "asbp.notification" || command.get("receipt") === undefined) {
      this.received += 1;
    }
    const u = command.get("u");
    const pending = u === undefined ? undefined : this.pending.get(Number(u));
    if (pending) {
      if (pending.take(command)) this.pending.delete(Number(u));
      return;
    }
    if (command.name === "asbp.notification") {
      const key = subscriptionKey(command.get("type") ?? "TOPIC", command.get("subscription") ?? "");
      const subscription = this.subscriptions.get(key);
      if (subscription) {
        subscription.deliver(command);
        return;
      }
    }
    this.emit("command", command);
  }

  // -- requests ------------------------------------------------------------

  private allocate(): number {
    for (let tries = 0; tries <= MAX_COMMAND_ID; tries++) {
      const id = this.nextId;
      this.nextId = id === MAX_COMMAND_ID ? 0 : id + 1;
      if (!this.pending.has(id)) return id;
    }
    throw new AsbpError(2106, "every Command-Identifier u is in flight");
  }

  /**
   * Send a Command with a fresh `u` and hand every Command carrying that `u`
   * to `take` until it returns true, the timeout passes or the signal aborts.
   */
  private exchange(
    name: string,
    body: Body | undefined,
    options: RequestOptions,
    take: (command: Command) => boolean,
    fail: (error: Error) => void,
  ): void {
    const { signal } = options;
    if (signal?.aborted) {
      fail(signal.reason as Error);
      return;
    }
    const id = this.allocate();
    const timeout = options.timeout ?? this.options.timeout;
    const finish = (): void => {
      clearTimeout(timer);
      signal?.removeEventListener("abort", abort);
    };
    const abandon = (error: Error): void => {
      if (this.pending.get(id) === entry) this.pending.delete(id);
      this.unqueue(make);
      finish();
      fail(error);
    };
    const abort = (): void => abandon(signal!.reason as Error);
    const timer = setTimeout(() => abandon(new TimeoutError(`no answer to '${name}' within ${timeout} ms`)), timeout);
    signal?.addEventListener("abort", abort, { once: true });
    const entry: Pending = {
      take: (command) => {
        const over = take(command);
        if (over) finish();
        return over;
      },
      fail: (error) => {
        finish();
        fail(error);
      },
    };
    const make = (): Command => new Command([["c", name], ["u", id], ...keysOf(options.keys)], body);
    this.pending.set(id, entry);
    try {
      this.dispatch(make);
    } catch (error) {
      abandon(error as Error);
    }
  }

  /**
   * Send a Command and resolve with its answer (the first part of a streamed one);
   * an `asbp.fault` rejects with FaultError, with its code.
   */
  request(name: string, body?: Body, options: RequestOptions = {}): Promise<Command> {
    return new Promise((resolve, reject) => {
      this.exchange(
        name,
        body,
        options,
        (command) => {
          if (isFault(command)) reject(faultOf(command));
          else resolve(command);
          return true;
        },
        reject,
      );
    });
  }

  /**
   * Send a Command and read its answer part by part (`t`/`o`, §1.3.4.2): the
   * iterator ends after part `t`, or after the one answer when it has neither key.
   */
  stream(name: string, body?: Body, options: RequestOptions = {}): AsyncIterableIterator<Command> {
    const controller = new AbortController();
    // Either signal ends the stream (AbortSignal.any is too new for React Native).
    const outer = options.signal;
    if (outer) {
      if (outer.aborted) controller.abort(outer.reason);
      else outer.addEventListener("abort", () => controller.abort(outer.reason), { once: true });
    }
    const signal = controller.signal;
    const inbox = new Inbox<Command>(() => controller.abort(new ConnectionLost("the stream was left")));
    let total: number | undefined;
    let seen = 0;
    this.exchange(
      name,
      body,
      { ...options, signal },
      (command) => {
        if (isFault(command)) {
          inbox.end(faultOf(command));
          return true;
        }
        const t = command.get("t");
        if (t !== undefined) total = Number(t);
        seen++;
        inbox.push(command);
        const over = total === undefined ? command.get("o") === undefined : seen >= total;
        if (over) inbox.end();
        return over;
      },
      (error) => inbox.end(error),
    );
    return inbox;
  }

  /** Send a Command that expects no answer (no `u`). */
  send(name: string, body?: Body, keys?: RequestOptions["keys"]): void {
    this.dispatch(() => new Command([["c", name], ...keysOf(keys)], body));
  }

  // -- Subjects --------------------------------------------------------------

  /**
   * Sign a Subject in through the broker's Authenticate-Command (`name`,
   * docs/protocol.md "Subjects"): resolves with a Subject handle once an
   * agent answers `asbp.authenticated`; a refusal is FaultError 3101.
   */
  async signIn(name: string, credentials: Body, options: RequestOptions = {}): Promise<Subject> {
    const answer = await this.request(name, credentials, options);
    if (answer.name !== "asbp.authenticated" || answer.get("s") === undefined) {
      throw new AsbpError(3101, `'${name}' was answered with '${answer.name}', not asbp.authenticated`);
    }
    const subject = new Subject(this, name, credentials, answer);
    this.subjects.add(subject);
    return subject;
  }

  /** @internal */
  forget(subject: Subject): void {
    this.subjects.delete(subject);
  }

  // -- topics and queues -----------------------------------------------------

  /** Publish to a topic (or a queue with `type: "QUEUE"`); resolves with `asbp.accepted` (its `id`). */
  publish(
    destination: string,
    body: Body,
    options: RequestOptions & { type?: "TOPIC" | "QUEUE" } = {},
  ): Promise<Command> {
    return this.request("asbp.publish", body, {
      ...options,
      keys: { ...options.keys, destination, type: options.type ?? "TOPIC" },
    });
  }

  /**
   * Subscribe to a topic pattern, a queue or a virtual queue. With a callback,
   * each notification goes to it; without, read the Subscription with `for await`.
   * Resolves once the broker has the subscription in place.
   */
  async subscribe(
    destination: string,
    options: RequestOptions & { type?: DestinationType; callback?: (notification: Command) => void } = {},
  ): Promise<Subscription> {
    const type = options.type ?? "TOPIC";
    const key = subscriptionKey(type, destination);
    if (this.subscriptions.has(key)) throw new AsbpError(2004, `already subscribed to ${type} ${destination}`);
    const subscription = new Subscription(this, destination, type, options.callback);
    this.subscriptions.set(key, subscription);
    try {
      await this.request("asbp.subscribe", undefined, { ...options, keys: { ...options.keys, destination, type } });
    } catch (error) {
      this.subscriptions.delete(key);
      throw error;
    }
    return subscription;
  }

  /** @internal */
  drop(subscription: Subscription): void {
    const key = subscriptionKey(subscription.type, subscription.destination);
    if (this.subscriptions.get(key) === subscription) this.subscriptions.delete(key);
  }

  /** Take up to `count` messages from a queue now, waiting up to `wait` seconds for the first. */
  poll(queue: string, options: RequestOptions & { count?: number; wait?: number } = {}): Promise<Command[]> {
    const messages: Command[] = [];
    return new Promise((resolve, reject) => {
      this.exchange(
        "asbp.poll",
        undefined,
        {
          ...options,
          keys: { ...options.keys, destination: queue, count: options.count ?? 1, wait: options.wait ?? 0 },
        },
        (command) => {
          if (command.name === "asbp.notification") {
            messages.push(command);
            return false;
          }
          if (isFault(command)) reject(faultOf(command));
          else resolve(messages);
          return true;
        },
        reject,
      );
    });
  }

  /** Acknowledge queue messages by their `receipt`s (notifications carry one). */
  ack(queue: string, receipts: string | readonly string[], options: RequestOptions = {}): Promise<Command> {
    return this.request("asbp.ack", undefined, {
      ...options,
      keys: { ...options.keys, destination: queue, receipt: receipts },
    });
  }
}

function keysOf(keys: RequestOptions["keys"]): [string, HeaderInput][] {
  if (!keys) return [];
  return Object.entries(keys).filter((entry): entry is [string, HeaderInput] => entry[1] !== undefined);
}
