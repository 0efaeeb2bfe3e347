// The fallback UTF-8 decoder (for runtimes without TextDecoder, such as older
// React Native) gives what TextDecoder gives, replacement characters included.
import { test } from "node:test";
import assert from "node:assert/strict";

test("the fallback decoder agrees with TextDecoder", async () => {
  const saved = globalThis.TextDecoder;
  globalThis.TextDecoder = undefined;
  let text;
  try {
    text = await import(`../dist/text.js?fallback`);
  } finally {
    globalThis.TextDecoder = saved;
  }
  const real = new TextDecoder();
  const alphabet = [0x41, 0x80, 0xbf, 0xc2, 0xdf, 0xe0, 0xed, 0xef, 0xf0, 0xf4, 0xff, 0xa0, 0x9f, 0x90, 0x8f];
  let seed = 1;
  const random = () => ((seed = (seed * 1103515245 + 12345) % 2 ** 31) / 2 ** 31);
  const samples = [[0xe2, 0x82, 0xac], [0xf0, 0x9f, 0x98, 0x80], [0xed, 0xa0, 0x80], [0xc0, 0xaf]];
  for (let n = 0; n < 50_000; n++) {
    samples.push(Array.from({ length: Math.floor(random() * 8) }, () => alphabet[Math.floor(random() * alphabet.length)]));
  }
  for (const sample of samples) {
    const bytes = Uint8Array.from(sample);
    assert.equal(text.utf8(bytes), real.decode(bytes), JSON.stringify(sample));
  }
  assert.equal(text.latin1(Uint8Array.from([0x63, 0x3d, 0x78, 0x3b])), "c=x;");
});
