/**
 * The two ways a Client reaches a broker's `/asbp`, behind one small interface:
 * a WebSocket Channel, and a stateless HTTP Channel (POST to send, GET to
 * long-poll, docs/protocol.md "Stateless HTTP Channels").
 *
 * A transport reports once that it is open (with the Channel-Identifier the
 * broker gave), then every frame it receives, then once that it closed. It
 * never reconnects: the Client decides when and how.
 */

import { Command, decode, encode, type Limits } from "./codec.js";
import { latin1 } from "./text.js";

/** What a WebSocket's greeting said besides `i` (docs/protocol.md, "Resuming a Channel"). */
export interface OpenInfo {
  /** The Channel secret (a new Channel): what resuming it takes. Never logged. */
  secret?: string;
  /** The Channel was resumed: the frames that follow continue the count from `received`. */
  resumed?: boolean;
  received?: number;
  /** Commands that passed the log's retention while away (fault 2111). */
  lost?: number;
  /** What followed the resumed Channel, as the broker said (`kept` of `asbp.resumed`:
   * `groups`, `subjects`, `subscriptions`): what the Client need not restore. */
  kept?: string[];
  /** The `s` of the Subjects that followed it (`subjects` of `asbp.resumed`). */
  subjects?: string[];
  /** Whether the client counts queue deliveries: false when the greeting said
   * `count=2` back (the broker leaves them out of the Channel's log). */
  countsDeliveries?: boolean;
}

/** Sent on every WebSocket to `/asbp`, new or resumed: the client does not count
 * queue deliveries, so a broker that says it back leaves them out of the log. */
const COUNT = "count=2";

/** A list key's items (the codec joins them with ","); none when absent. */
const items = (value: string | undefined): string[] => (value ? value.split(",") : []);

/** A WebSocket to take a lost Channel back: its `i`, secret, and the frames received. */
export interface ResumeFrom {
  channelId: string;
  secret: string;
  received: number;
}

export interface TransportEvents {
  /** The broker gave the Channel `channelId`: Commands may be sent. */
  open(channelId: string, info?: OpenInfo): void;
  /** One frame (one Command) from the broker. */
  frame(frame: Uint8Array): void;
  /** The transport is gone; `opened` says whether it ever opened; `refused`: the
   * broker could not resume the Channel (2110, 2113): open a new one; `unread`: the
   * broker is stopping (close 1012, fault 2114) and said how many frames it acted
   * on: these are the ones it did not, to send again first where the Channel resumes;
   * `retryAfter`: the broker turned the attempt away (503, 429) and said when to come
   * back, in milliseconds (long-poll only: see retryAfterMs). */
  close(
    opened: boolean,
    reason: string,
    refused?: boolean,
    unread?: Uint8Array<ArrayBuffer>[],
    retryAfter?: number,
  ): void;
}

/** The longest wait a `Retry-After` asks for that the client honours (ms). */
export const MAX_RETRY_AFTER = 60_000;

/**
 * The wait a 503 or 429 asks for, in milliseconds: its `Retry-After` (whole seconds
 * or an HTTP date, RFC 9110 §10.2.3), capped at MAX_RETRY_AFTER; undefined for any
 * other status or a header that is neither form. Only a fetch response shows it: a
 * browser's WebSocket API reports a refused handshake as a bare `error` event, with
 * neither status nor headers, so a WebSocket attempt backs off as for any failure.
 */
export function retryAfterMs(response: Response, now: number = Date.now()): number | undefined {
  if (response.status !== 503 && response.status !== 429) return undefined;
  const value = response.headers.get("retry-after")?.trim();
  if (!value) return undefined;
  if (/^\d+$/.test(value)) return Math.min(Number(value) * 1000, MAX_RETRY_AFTER);
  // An HTTP date names its zone (GMT); anything Date cannot read is ignored.
  const when = /GMT$/.test(value) ? Date.parse(value) : NaN;
  if (Number.isNaN(when)) return undefined;
  return Math.min(Math.max(when - now, 0), MAX_RETRY_AFTER);
}

export interface Transport {
  readonly kind: "websocket" | "long-poll";
  send(command: Command): void;
  /** Send a frame already encoded (what a stopping broker did not read): WebSocket only. */
  sendFrame?(frame: Uint8Array<ArrayBuffer>): void;
  close(): void;
}

/** How many frames sent on a WebSocket are kept, to send again those a stopping
 * broker did not act on (docs/protocol.md, "A broker that stops"): it leaves unread
 * only what was in flight, far fewer. */
export const RESEND_WINDOW = 4096;
/** A stopping broker's close: "Service Restart", with how many frames it read. */
const SERVICE_RESTART = 1012;

/** The WebSocket constructor's shape: the browser's, React Native's and Node 22's all fit. */
export type WebSocketLike = new (url: string, protocols?: string | string[]) => WebSocket;
export type FetchLike = typeof fetch;

/** One WebSocket Channel: the broker speaks first (`asbp.channel` with `i`); or, with
 * `resume`, the client does (`asbp.resume`) and the broker answers `asbp.resumed`. */
export function openWebSocket(
  url: string,
  events: TransportEvents,
  Impl: WebSocketLike,
  limits: Limits,
  resume?: ResumeFrom,
): Transport {
  let opened = false;
  let closed = false;
  let lost = 0;
  // Frames sent since the greeting, counted as the broker counts them (`read=<n>`),
  // the last RESEND_WINDOW kept.
  let sentCount = 0;
  const sent: Uint8Array<ArrayBuffer>[] = [];
  const counted = `${url}${url.includes("?") ? "&" : "?"}${COUNT}`;
  const target = resume ? `${counted}&resume=${resume.channelId}` : counted;
  const socket = new Impl(target, ["asbp"]);
  // Frames arrive as text or binary (docs/protocol.md): ArrayBuffer, never Blob,
  // so both are read synchronously and in order.
  socket.binaryType = "arraybuffer";
  const finish = (reason: string, refused = false, unread?: Uint8Array<ArrayBuffer>[]): void => {
    if (closed) return;
    closed = true;
    events.close(opened, reason, refused, unread);
  };
  const write = (frame: Uint8Array<ArrayBuffer>): void => {
    // Counted even once the socket is closing (it drops the frame): past `read=<n>`,
    // it goes again where the Channel resumes.
    sentCount += 1;
    sent.push(frame);
    if (sent.length > RESEND_WINDOW) sent.shift();
    socket.send(frame);
  };
  if (resume) {
    socket.onopen = () => {
      const keys = { c: "asbp.resume", i: resume.channelId, secret: resume.secret, received: String(resume.received) };
      socket.send(encode(new Command(keys), limits));
    };
  }
  socket.onmessage = (event: MessageEvent) => {
    if (closed) return;
    const data = event.data as ArrayBuffer | string;
    const frame = typeof data === "string" ? new TextEncoder().encode(data) : new Uint8Array(data);
    if (!opened) {
      let greeting: Command | undefined;
      try {
        greeting = decode(frame, limits);
      } catch {
        // Not a broker: handled below.
      }
      const channelId = greeting?.get("i");
      if (resume && greeting?.name === "asbp.fault") {
        const code = greeting.get("code");
        if (code === "2111") {
          lost = Number(/^\d+/.exec(greeting.text())?.[0] ?? 0); // a gap, then it carries on
          return;
        }
        socket.close();
        finish(`the Channel was not resumed (${code} ${greeting.text()})`, code === "2110" || code === "2113");
        return;
      }
      const expected = resume ? "asbp.resumed" : "asbp.channel";
      if (greeting?.name !== expected || channelId === undefined) {
        socket.close();
        finish(`the server did not greet with ${expected}`);
        return;
      }
      opened = true;
      if (resume) {
        events.open(channelId, {
          resumed: true,
          received: Number(greeting.get("received") ?? 0),
          lost,
          kept: items(greeting.get("kept")),
          subjects: items(greeting.get("subjects")),
          countsDeliveries: greeting.get("count") !== "2",
        });
      }
      else events.open(channelId, { secret: greeting.get("secret"), countsDeliveries: greeting.get("count") !== "2" });
      return;
    }
    events.frame(frame);
  };
  socket.onclose = (event: CloseEvent) => {
    const reason = `WebSocket closed (${event.code}${event.reason ? ` ${event.reason}` : ""})`;
    const read = event.code === SERVICE_RESTART ? /\bread=(\d+)/.exec(event.reason) : null;
    if (read === null || !opened) return finish(reason);
    const unread = Math.max(0, sentCount - Number(read[1]));
    finish(reason, false, sent.slice(sent.length - Math.min(unread, sent.length)));
  };
  socket.onerror = () => {
    if (closed) return;
    // Finished first: some runtimes (Node's undici) fire error again from close().
    finish("WebSocket error");
    // onclose follows onerror; closing here too makes it certain in every runtime.
    try {
      socket.close();
    } catch {
      /* already closing */
    }
  };
  return {
    kind: "websocket",
    send(command) {
      write(encode(command, limits));
    },
    sendFrame(frame) {
      write(frame);
    },
    close() {
      if (closed) return;
      finish("closed by the client");
      try {
        socket.close(1000);
      } catch {
        /* already closed */
      }
    },
  };
}


/** The Commands of one long-poll response body: multipart/mixed, one Command per part. */
export function parseMultipart(body: Uint8Array, contentType: string): { seq: number; frame: Uint8Array }[] {
  const match = /boundary="?([^";]+)"?/.exec(contentType);
  if (!match) return [];
  const marker = `--${match[1]}`;
  const parts: { seq: number; frame: Uint8Array }[] = [];
  let at = 0;
  for (;;) {
    // Each part: marker CRLF, headers, CRLF CRLF, exactly Content-Length bytes, CRLF.
    const head = latin1(body.subarray(at, Math.min(body.length, at + 1024)));
    if (!head.startsWith(marker) || head.startsWith(`${marker}--`)) break;
    const headersEnd = head.indexOf("\r\n\r\n");
    if (headersEnd === -1) break;
    const headers = head.slice(marker.length, headersEnd);
    const length = Number(/content-length:\s*(\d+)/i.exec(headers)?.[1] ?? NaN);
    const seq = Number(/asbp-seq:\s*(\d+)/i.exec(headers)?.[1] ?? NaN);
    if (!Number.isFinite(length)) break;
    const start = at + headersEnd + 4;
    parts.push({ seq, frame: body.subarray(start, start + length) });
    at = start + length + 2;
  }
  return parts;
}

/**
 * One stateless HTTP Channel: `POST c=asbp.channel;` opens it, every send is a
 * POST carrying `i`, and one GET at a time long-polls the Channel's mailbox,
 * acknowledging with `after` what it has read.
 */
export function openLongPoll(
  url: string,
  events: TransportEvents,
  fetchImpl: FetchLike,
  limits: Limits,
  wait: number,
): Transport {
  let channelId: string | undefined;
  // The Channel secret from asbp.accepted: every later request presents it,
  // because `i` alone proves nothing (docs/protocol.md, "The Channel secret").
  // A header rather than the broker's HttpOnly cookie, so that it works the
  // same in Node, React Native and pages of another origin.
  let secret: string | undefined;
  let closed = false;
  let opened = false;
  let after = 0;
  // POSTs go one at a time, so the broker receives Commands in the order sent
  // (messaging answers and stores them in that order).
  let sending: Promise<void> = Promise.resolve();
  const stop = new AbortController();
  const finish = (reason: string, retryAfter?: number): void => {
    if (closed) return;
    closed = true;
    stop.abort();
    events.close(opened, reason, undefined, undefined, retryAfter);
  };
  const proof = (): Record<string, string> => (secret === undefined ? {} : { "asbp-secret": secret });
  const post = async (frame: Uint8Array<ArrayBuffer>): Promise<Response> =>
    fetchImpl(url, {
      method: "POST",
      body: frame,
      headers: { "content-type": "application/asbp", ...proof() },
      signal: stop.signal,
    });
  // A POST's answer is the transport's own asbp.accepted, or a fault for what
  // was wrong before routing: only the fault is news for the Client.
  const answer = async (response: Response): Promise<void> => {
    const body = new Uint8Array(await response.arrayBuffer());
    if (response.status === 404 || response.status === 410) finish(`the HTTP Channel is gone (${response.status})`);
    else if (!response.ok && body.length) events.frame(body);
  };
  const pollLoop = async (): Promise<void> => {
    while (!closed) {
      const response = await fetchImpl(`${url}?i=${channelId}&after=${after}&wait=${wait}`, {
        signal: stop.signal,
        cache: "no-store",
        headers: proof(),
      });
      if (response.status === 204) {
        await response.arrayBuffer();
        continue;
      }
      const body = new Uint8Array(await response.arrayBuffer());
      if (!response.ok) {
        finish(`long-poll answered ${response.status}`, retryAfterMs(response));
        return;
      }
      for (const part of parseMultipart(body, response.headers.get("content-type") ?? "")) {
        // Delivery is at-least-once: a part already read comes again when a
        // response was lost, and its sequence number says so.
        if (part.seq <= after) continue;
        after = part.seq;
        if (closed) return;
        events.frame(part.frame);
      }
    }
  };
  (async () => {
    const response = await post(new TextEncoder().encode("c=asbp.channel;"));
    const body = new Uint8Array(await response.arrayBuffer());
    if (!response.ok) {
      // 503 past the broker's handshakes in flight (2115), 429 past the address's rate
      // of opens (2108): not before its Retry-After.
      finish(`opening an HTTP Channel answered ${response.status}`, retryAfterMs(response));
      return;
    }
    const accepted = decode(body, limits);
    channelId = accepted.get("i");
    secret = accepted.get("secret");
    if (channelId === undefined) throw new Error("the broker's answer carried no Channel-Identifier");
    if (secret === undefined) throw new Error("the broker's answer carried no Channel secret");
    opened = true;
    events.open(channelId);
    await pollLoop();
  })().catch((error: unknown) => finish(`long-poll failed: ${String(error)}`));
  return {
    kind: "long-poll",
    send(command) {
      if (channelId === undefined) throw new Error("the HTTP Channel is not open yet");
      const keys: [string, string | readonly string[]][] = [...command.header];
      if (!command.header.has("i")) keys.push(["i", channelId]);
      const frame = encode(new Command(keys, command.body), limits);
      sending = sending
        .then(() => (closed ? undefined : post(frame).then(answer)))
        .catch((error: unknown) => finish(`POST failed: ${String(error)}`));
    },
    close() {
      finish("closed by the client");
    },
  };
}
