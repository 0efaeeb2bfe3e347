/**
 * Bytes to text without relying on TextDecoder, which React Native's Hermes
 * lacks in older releases (TextEncoder it has). Where TextDecoder exists it is used.
 */

const Decoder = (globalThis as { TextDecoder?: typeof TextDecoder }).TextDecoder;
const native = Decoder ? new Decoder() : undefined;

/** Bytes below 0x100 as the characters of the same code (ASCII headers, multipart heads). */
export function latin1(bytes: Uint8Array): string {
  let text = "";
  for (let at = 0; at < bytes.length; at += 8192) {
    text += String.fromCharCode(...bytes.subarray(at, at + 8192));
  }
  return text;
}

/** UTF-8 to text; an invalid sequence becomes U+FFFD, as TextDecoder does. */
export function utf8(bytes: Uint8Array): string {
  if (native) return native.decode(bytes);
  const points: number[] = [];
  for (let n = 0; n < bytes.length; ) {
    const b = bytes[n]!;
    const need = b < 0x80 ? 0 : b >= 0xc2 && b <= 0xdf ? 1 : b >= 0xe0 && b <= 0xef ? 2 : b >= 0xf0 && b <= 0xf4 ? 3 : -1;
    let point = need === 0 ? b : need === 1 ? b & 0x1f : need === 2 ? b & 0x0f : b & 0x07;
    let k = 1;
    for (; need > 0 && k <= need; k++) {
      const c = bytes[n + k];
      const lo = k === 1 && b === 0xe0 ? 0xa0 : k === 1 && b === 0xf0 ? 0x90 : 0x80;
      const hi = k === 1 && b === 0xed ? 0x9f : k === 1 && b === 0xf4 ? 0x8f : 0xbf;
      if (c === undefined || c < lo || c > hi) break;
      point = (point << 6) | (c & 0x3f);
    }
    if (need < 0 || k <= need) {
      points.push(0xfffd);
      // One U+FFFD per maximal invalid subpart; the byte that broke it is read again.
      n += need < 0 ? 1 : k;
      continue;
    }
    points.push(point);
    n += need + 1;
  }
  let text = "";
  for (let at = 0; at < points.length; at += 8192) text += String.fromCodePoint(...points.slice(at, at + 8192));
  return text;
}
