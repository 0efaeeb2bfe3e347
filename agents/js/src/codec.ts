/**
 * decode and encode: the grammar, limits and fault codes of asbp/ (grammar.py,
 * header.py, codec.py) in TypeScript. tests/vectors/frames.json, generated from
 * the Python codec, holds both to the same answers, byte offsets included.
 *
 * One transport frame is one Command: `header ";" body`, the body running to
 * the end of the frame. Without a leading "+" the header is ASCII, with it UTF-8.
 */

import { FaultCode, ProtocolError } from "./errors.js";
import { latin1, utf8 as utf8Text } from "./text.js";

/** A decoded value: one token, or the tokens of a bracketed list. */
export type HeaderValue = string | readonly string[];
/** What callers may pass: text, a whole number, or a list of texts. */
export type HeaderInput = string | number | readonly string[];

/** Size limits, inclusive, as asbp.Limits (the same defaults). */
export interface Limits {
  maxFrameBytes: number;
  maxHeaderBytes: number;
  maxKeys: number;
  maxListItems: number;
}

export const DEFAULT_LIMITS: Readonly<Limits> = Object.freeze({
  maxFrameBytes: 256 * 1024,
  maxHeaderBytes: 8 * 1024,
  maxKeys: 64,
  maxListItems: 1024,
});

/** §1.3.4.2 u: a User-Agent's Command-Identifier runs 0..65535, then wraps. */
export const MAX_COMMAND_ID = 65535;

// Python's str.isspace, which is what asbp's `\s` matches: JS's `\s` differs
// (it holds U+FEFF, which Python's does not), so the class is written out.
const WS = "\\t\\n\\v\\f\\r\\x1c-\\x20\\x85\\xa0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000";
const BARE_CHAR = `[^;=,'\\[\\]+${WS}\\x00-\\x1f\\x7f-\\x9f\\ud800-\\udfff]`;
const BARE = `${BARE_CHAR}+`;
const QUOTED = "'[^'\\r\\n\\ud800-\\udfff]*'";
const TOKEN = `(?:${BARE}|${QUOTED})`;
const LIST = `\\[(?:${TOKEN}(?:,${TOKEN})*)?\\]`;
const PAIR = `${BARE}=(?:${TOKEN}|${LIST})`;
// The "u" flag makes the classes work on code points, so astral characters
// (two UTF-16 units) are one bare character, as in Python.
const HEADER_RE = new RegExp(`^${PAIR}(?:,${PAIR})*$`, "u");
const PAIR_RE = new RegExp(`(${BARE})=(?:(${TOKEN})|(${LIST}))`, "gu");
const ITEM_RE = new RegExp(TOKEN, "gu");
const BARE_RE = new RegExp(`^${BARE}$`, "u");
const BARE_CHAR_RE = new RegExp(`^${BARE_CHAR}$`, "u");
const WS_RE = new RegExp(`^[${WS}]$`, "u");
const UNCARRIABLE_RE = /['\r\n]|[\ud800-\udbff](?![\udc00-\udfff])|(?<![\ud800-\udbff])[\udc00-\udfff]/;
const RESERVED = ";=,'[]+";

// -- the reserved keys (asbp/header.py) ------------------------------------

const UUID_HEX = /^[0-9a-f]{32}$/;
const UINT = /^(?:0|[1-9][0-9]*)$/;
const POSITIVE = /^[1-9][0-9]*$/;
const OID = /^(?:0|[1-9][0-9]*)(?:\.(?:0|[1-9][0-9]*))+$/;
const RN = "[A-Za-z0-9][A-Za-z0-9!#$&^_.+-]{0,126}";
const MIME = new RegExp(`^${RN}/${RN}(?:[${WS}]*;[^]*)?$`, "u");
const COMPRESSION = new RegExp(`^(?:${RN}/)?${RN}$`);
const CHARSET = /^[A-Za-z0-9!#$%&+\-^_`{}~.:]{1,64}$/;
const ADDRESS_PART = `[^*'${WS}\\x00-\\x1f\\x7f-\\x9f]+`;
const ADDRESS = new RegExp(`^${ADDRESS_PART}\\*${ADDRESS_PART}$`, "u");

type Check = (value: string) => string | null;
const rule = (re: RegExp, why: string): Check => (v) => (re.test(v) ? null : why);
const nonEmpty: Check = (v) => (v ? null : "must not be empty");
const uuid = rule(UUID_HEX, "must be a UUID as 32 lowercase hex digits without dashes");
const address = rule(ADDRESS, "must be a Conversation-Address such as bob*example.org");

/** key → [takes a list, check]: the table of asbp/header.py. */
const RESERVED_KEYS: Readonly<Record<string, readonly [boolean, Check]>> = {
  a: [false, nonEmpty],
  b: [false, nonEmpty],
  c: [false, nonEmpty],
  d: [true, uuid],
  e: [false, rule(CHARSET, "must be a charset name such as UTF-8")],
  f: [false, rule(OID, "must be an OID such as 1.3.6.1.4.1")],
  g: [true, nonEmpty],
  i: [false, uuid],
  o: [false, rule(POSITIVE, "must be a one-based unsigned integer without leading zeros")],
  m: [false, rule(MIME, "must be a MIME type such as text/plain")],
  r: [true, address],
  p: [false, address],
  s: [false, uuid],
  t: [false, rule(UINT, "must be an unsigned integer without leading zeros")],
  u: [
    false,
    (v) =>
      UINT.test(v) && v.length <= 5 && Number(v) <= MAX_COMMAND_ID
        ? null
        : `must be an integer from 0 to ${MAX_COMMAND_ID} without leading zeros`,
  ],
  x: [false, nonEmpty],
  z: [false, rule(COMPRESSION, "must be a MIME type or its part after 'application/', such as x-gzip")],
};

function checkValue(key: string, value: HeaderValue): string | null {
  if (!Object.prototype.hasOwnProperty.call(RESERVED_KEYS, key)) return null;
  const [many, check] = RESERVED_KEYS[key]!;
  if (typeof value === "string") return check(value);
  if (!many) return "takes a single value, not a list";
  if (value.length === 0) return "takes one or more values, not an empty list";
  for (const item of value) {
    const why = check(item);
    if (why !== null) return why;
  }
  return null;
}

// -- Command -------------------------------------------------------------

const utf8 = new TextEncoder();
const EMPTY = new Uint8Array(0);

/** One Command: a header (keys in order) and an opaque body. Immutable once built. */
export class Command {
  readonly header: ReadonlyMap<string, HeaderValue>;
  readonly body: Uint8Array;

  /**
   * Build a Command from keys and a body (text is UTF-8 encoded), checked as
   * asbp.Command checks it: a ProtocolError (1201 or 1203) for a key or value
   * no header can carry or that breaks a reserved key's rule.
   */
  constructor(
    header: Iterable<readonly [string, HeaderInput]> | Readonly<Record<string, HeaderInput | undefined>>,
    body: Uint8Array | string = EMPTY,
  ) {
    const items = new Map<string, HeaderValue>();
    const pairs: Iterable<readonly [string, HeaderInput | undefined]> =
      Symbol.iterator in header
        ? (header as Iterable<readonly [string, HeaderInput]>)
        : Object.entries(header as Record<string, HeaderInput | undefined>);
    for (const [key, input] of pairs) {
      if (input === undefined) continue;
      if (items.has(key)) throw new ProtocolError(FaultCode.INVALID_MESSAGE_FORMAT, `duplicate key '${key}'`);
      items.set(key, normalize(key, input));
    }
    if (items.size === 0) throw new ProtocolError(FaultCode.INVALID_MESSAGE_FORMAT, "a Command needs at least one key");
    this.header = items;
    this.body = typeof body === "string" ? utf8.encode(body) : body;
  }

  /** A key's value as text (a list's items joined by ","), or undefined. */
  get(key: string): string | undefined {
    const value = this.header.get(key);
    return value === undefined || typeof value === "string" ? value : value.join(",");
  }

  /** `c`, the Command-Name. */
  get name(): string | undefined {
    return this.get("c");
  }

  /** The body as text (UTF-8, invalid sequences replaced). */
  text(): string {
    return utf8Text(this.body);
  }
}

function normalize(key: string, input: HeaderInput): HeaderValue {
  if (!BARE_RE.test(key)) {
    throw new ProtocolError(
      FaultCode.INVALID_MESSAGE_FORMAT,
      `key '${key}' is not a bare token (no reserved characters, whitespace or controls, and not empty)`,
    );
  }
  let value: HeaderValue;
  let texts: readonly string[];
  if (typeof input === "number") {
    if (!Number.isSafeInteger(input)) throw new TypeError(`value of '${key}' must be a whole number`);
    value = String(input);
    texts = [];
  } else if (typeof input === "string") {
    value = input;
    texts = [input];
  } else {
    value = Object.freeze([...input]);
    texts = value;
  }
  for (const text of texts) {
    if (typeof text !== "string") throw new TypeError(`list items of '${key}' must be strings`);
    if (UNCARRIABLE_RE.test(text)) {
      throw new ProtocolError(
        FaultCode.INVALID_HEADER_VALUE,
        `key '${key}': no ASBP header can carry a quote, CR, LF or lone surrogate (there is no escaping)`,
      );
    }
  }
  const why = checkValue(key, value);
  if (why !== null) throw new ProtocolError(FaultCode.INVALID_HEADER_VALUE, `key '${key}': ${why}`);
  return value;
}

// -- decode --------------------------------------------------------------

const SEMICOLON = 0x3b;
const QUOTE = 0x27;
const PLUS = 0x2b;

/**
 * Read one Command from one frame (bytes, or a string taken as its UTF-8 encoding).
 * Throws ProtocolError with the code and byte offset asbp.decode gives.
 */
export function decode(frame: Uint8Array | ArrayBuffer | string, limits: Limits = DEFAULT_LIMITS): Command {
  const bytes =
    typeof frame === "string" ? utf8.encode(frame) : frame instanceof Uint8Array ? frame : new Uint8Array(frame);
  const size = bytes.length;
  if (size > limits.maxFrameBytes) {
    throw new ProtocolError(
      FaultCode.INVALID_MESSAGE_SIZE,
      `frame of ${size} bytes exceeds the limit of ${limits.maxFrameBytes}`,
      limits.maxFrameBytes,
    );
  }
  const headerLimit = limits.maxHeaderBytes;
  let end = -1;
  let quoted = false;
  for (let n = 0, stop = Math.min(size, headerLimit + 1); n < stop; n++) {
    const b = bytes[n];
    if (b === SEMICOLON) {
      end = n;
      break;
    }
    if (b === QUOTE) quoted = true;
  }
  if (end === -1 || quoted) end = quotedHeaderEnd(bytes, headerLimit);
  let base: number;
  let text: string;
  if (bytes[0] === PLUS) {
    base = 1;
    const bad = invalidUtf8(bytes, 1, end);
    if (bad !== -1) {
      throw new ProtocolError(FaultCode.INVALID_MESSAGE_FORMAT, "header is not valid UTF-8", bad);
    }
    text = utf8Text(bytes.subarray(1, end));
  } else {
    base = 0;
    for (let n = 0; n < end; n++) {
      if (bytes[n]! >= 0x80) {
        throw new ProtocolError(
          FaultCode.INVALID_MESSAGE_FORMAT,
          `byte 0x${bytes[n]!.toString(16)} is not ASCII and the header does not start with '+', the UTF-8 marker`,
          n,
        );
      }
    }
    text = latin1(bytes.subarray(0, end));
  }
  if (!HEADER_RE.test(text)) diagnose(text, base);
  const pairs = [...text.matchAll(PAIR_RE)];
  if (pairs.length > limits.maxKeys) {
    throw new ProtocolError(
      FaultCode.TOO_MANY_KEYS,
      `header has ${pairs.length} keys, more than the limit of ${limits.maxKeys}`,
      byteOffset(text, pairs[limits.maxKeys]!.index!, base),
    );
  }
  const header = new Map<string, HeaderValue>();
  for (const match of pairs) {
    const [, key, token, items] = match as unknown as [string, string, string | undefined, string | undefined];
    const at = (): number => byteOffset(text, match.index!, base);
    if (header.has(key)) throw new ProtocolError(FaultCode.INVALID_MESSAGE_FORMAT, `duplicate key '${key}'`, at());
    let value: HeaderValue;
    if (token !== undefined) {
      value = token.charCodeAt(0) === QUOTE ? token.slice(1, -1) : token;
    } else {
      const tokens = items!.match(ITEM_RE) ?? [];
      if (tokens.length > limits.maxListItems) {
        throw new ProtocolError(
          FaultCode.TOO_MANY_LIST_ITEMS,
          `list of '${key}' has ${tokens.length} items, more than the limit of ${limits.maxListItems}`,
          at(),
        );
      }
      value = Object.freeze(tokens.map((t) => (t.charCodeAt(0) === QUOTE ? t.slice(1, -1) : t)));
    }
    const why = checkValue(key, value);
    if (why !== null) throw new ProtocolError(FaultCode.INVALID_HEADER_VALUE, `key '${key}': ${why}`, at());
    header.set(key, value);
  }
  const command = Object.create(Command.prototype) as { header: Map<string, HeaderValue>; body: Uint8Array };
  command.header = header;
  command.body = bytes.subarray(end + 1);
  return command as unknown as Command;
}

/** The terminator when quotes may hide a ";" (asbp.codec._quoted_header_end). */
function quotedHeaderEnd(bytes: Uint8Array, headerLimit: number): number {
  const window = Math.min(headerLimit + 1, bytes.length);
  // (?:[^;']+|'[^']*')* over the window: stop at ";" outside quotes, or at a
  // quote that does not close within the window.
  let end = 0;
  while (end < window) {
    const b = bytes[end];
    if (b === SEMICOLON) break;
    if (b === QUOTE) {
      let close = end + 1;
      while (close < window && bytes[close] !== QUOTE) close++;
      if (close >= window) break;
      end = close + 1;
    } else {
      end++;
    }
  }
  if (end <= headerLimit) {
    if (end === bytes.length) throw new ProtocolError(FaultCode.INVALID_MESSAGE_FORMAT, "no ';' ends the header", end);
    if (bytes[end] === SEMICOLON) return end;
    if (bytes.indexOf(QUOTE, end + 1) === -1) {
      throw new ProtocolError(FaultCode.INVALID_MESSAGE_FORMAT, "quoted token is never closed", end);
    }
  }
  throw new ProtocolError(
    FaultCode.HEADER_TOO_LARGE,
    `no ';' ends the header within the limit of ${headerLimit} bytes`,
    headerLimit,
  );
}

/** The offset of the first byte of the first invalid UTF-8 sequence in [start, end), or -1. */
function invalidUtf8(bytes: Uint8Array, start: number, end: number): number {
  let n = start;
  while (n < end) {
    const b = bytes[n]!;
    if (b < 0x80) {
      n++;
      continue;
    }
    let need: number;
    let lo = 0x80;
    let hi = 0xbf;
    if (b >= 0xc2 && b <= 0xdf) need = 1;
    else if (b >= 0xe0 && b <= 0xef) {
      need = 2;
      if (b === 0xe0) lo = 0xa0;
      else if (b === 0xed) hi = 0x9f;
    } else if (b >= 0xf0 && b <= 0xf4) {
      need = 3;
      if (b === 0xf0) lo = 0x90;
      else if (b === 0xf4) hi = 0x8f;
    } else return n;
    for (let k = 1; k <= need; k++) {
      const c = n + k < end ? bytes[n + k]! : -1;
      if (c < (k === 1 ? lo : 0x80) || c > (k === 1 ? hi : 0xbf)) return n;
    }
    n += need + 1;
  }
  return -1;
}

function byteOffset(text: string, index: number, base: number): number {
  return base + utf8.encode(text.slice(0, index)).length;
}

function describe(char: string): string {
  if (char === "+") return "'+' (the UTF-8 marker may only be the first byte of a header)";
  const hex = char.codePointAt(0)!.toString(16).toUpperCase().padStart(4, "0");
  if (WS_RE.test(char)) return `whitespace U+${hex} outside quotes`;
  if (RESERVED.includes(char)) return `reserved character '${char}'`;
  if (BARE_CHAR_RE.test(char)) return `'${char}'`;
  return `control character U+${hex} outside quotes`;
}

/** Walk a header the regular expression refused and throw what is wrong, where (asbp.codec._diagnose). */
function diagnose(text: string, base: number): never {
  const fail = (message: string, index: number): never => {
    throw new ProtocolError(FaultCode.INVALID_MESSAGE_FORMAT, message, byteOffset(text, index, base));
  };
  const size = text.length;
  const charAt = (pos: number): string => String.fromCodePoint(text.codePointAt(pos)!);
  const bare = (pos: number): number => {
    while (pos < size) {
      const char = charAt(pos);
      if (!BARE_CHAR_RE.test(char)) break;
      pos += char.length;
    }
    return pos;
  };
  const token = (pos: number, what: string): number => {
    if (pos === size) fail(`${what} is missing before the end of the header`, pos);
    if (text[pos] === "'") {
      const close = text.indexOf("'", pos + 1);
      const found = [text.indexOf("\r", pos + 1), text.indexOf("\n", pos + 1)].filter((i) => i !== -1);
      const newline = found.length ? Math.min(...found) : -1;
      if (newline !== -1 && (close === -1 || newline < close)) fail("CR or LF inside a quoted token", newline);
      if (close === -1) fail("quoted token is never closed", pos);
      return close + 1;
    }
    const end = bare(pos);
    if (end === pos) {
      const char = charAt(pos);
      if (",;]".includes(char)) fail(`${what} is empty (write '' for an empty text)`, pos);
      fail(`${what} cannot start with ${describe(char)}`, pos);
    }
    return end;
  };
  let pos = 0;
  if (size === 0) fail("header is empty; a Command needs at least one key", 0);
  for (;;) {
    const end = bare(pos);
    if (end === pos) fail(`expected a key, found ${describe(charAt(pos))}`, pos);
    if (end === size) fail(`key '${text.slice(pos, end)}' has no '=' and value`, end);
    if (text[end] !== "=") fail(`expected '=' after key '${text.slice(pos, end)}', found ${describe(charAt(end))}`, end);
    pos = end + 1;
    if (pos < size && text[pos] === "[") {
      pos++;
      if (pos < size && text[pos] === "]") pos++;
      else {
        for (;;) {
          pos = token(pos, "list item");
          if (pos === size) fail("list is never closed with ']'", pos);
          if (text[pos] === "]") {
            pos++;
            break;
          }
          if (text[pos] !== ",") fail(`expected ',' or ']' in a list, found ${describe(charAt(pos))}`, pos);
          pos++;
        }
      }
    } else {
      pos = token(pos, "value");
    }
    if (pos === size) break;
    if (text[pos] !== ",") fail(`expected ',' or ';' after a value, found ${describe(charAt(pos))}`, pos);
    pos++;
    if (pos === size) fail("trailing ',' before the end of the header", pos - 1);
  }
  // The scanner accepted what the regular expression refused: a bug, still a fault.
  throw new ProtocolError(FaultCode.INVALID_MESSAGE_FORMAT, "header refused by the grammar", base);
}

// -- encode --------------------------------------------------------------

function tokenText(value: string): string {
  return BARE_RE.test(value) ? value : `'${value}'`;
}

/** The header text of a Command (what goes before ";"), "+" marker included when needed. */
function headerText(command: Command, limits: Limits): string {
  const header = command.header;
  if (header.size > limits.maxKeys) {
    throw new ProtocolError(
      FaultCode.TOO_MANY_KEYS,
      `header has ${header.size} keys, more than the limit of ${limits.maxKeys}`,
    );
  }
  const parts: string[] = [];
  for (const [key, value] of header) {
    if (typeof value === "string") parts.push(`${key}=${tokenText(value)}`);
    else {
      if (value.length > limits.maxListItems) {
        throw new ProtocolError(
          FaultCode.TOO_MANY_LIST_ITEMS,
          `list of '${key}' has ${value.length} items, more than the limit of ${limits.maxListItems}`,
        );
      }
      parts.push(`${key}=[${value.map(tokenText).join(",")}]`);
    }
  }
  const text = parts.join(",");
  // eslint-disable-next-line no-control-regex
  return /^[\x00-\x7f]*$/.test(text) ? text : `+${text}`;
}

/** Write one Command as one frame; ProtocolError (1101, 1104, 1105, 1106) past the limits. */
export function encode(command: Command, limits: Limits = DEFAULT_LIMITS): Uint8Array<ArrayBuffer> {
  const head = utf8.encode(headerText(command, limits));
  if (head.length > limits.maxHeaderBytes) {
    throw new ProtocolError(
      FaultCode.HEADER_TOO_LARGE,
      `header of ${head.length} bytes exceeds the limit of ${limits.maxHeaderBytes}`,
    );
  }
  const size = head.length + 1 + command.body.length;
  if (size > limits.maxFrameBytes) {
    throw new ProtocolError(
      FaultCode.INVALID_MESSAGE_SIZE,
      `frame of ${size} bytes exceeds the limit of ${limits.maxFrameBytes}`,
    );
  }
  const frame = new Uint8Array(size);
  frame.set(head, 0);
  frame[head.length] = SEMICOLON;
  frame.set(command.body, head.length + 1);
  return frame;
}
