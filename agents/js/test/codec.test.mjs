// The codec against tests/vectors/frames.json, the file the Python codec is
// checked against too (tests/asbp/test_vectors.py): same frames, same answers.
import { test } from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { Command, decode, encode, DEFAULT_LIMITS, ProtocolError } from "../dist/index.js";

const vectors = JSON.parse(
  readFileSync(new URL("../../../tests/vectors/frames.json", import.meta.url), "utf-8"),
);

const fromHex = (hex) => Uint8Array.from(hex.match(/../g) ?? [], (h) => parseInt(h, 16));
const utf8 = new TextEncoder();

function bytesOf(entry, name) {
  if (entry[`${name}_hex`] !== undefined) return fromHex(entry[`${name}_hex`]);
  if (entry[`${name}_repeat`] !== undefined) {
    const [prefix, unit, count, suffix] = entry[`${name}_repeat`];
    return utf8.encode(prefix + unit.repeat(count) + suffix);
  }
  return utf8.encode(entry[name]);
}

function limitsOf(entry) {
  const l = entry.limits;
  if (!l) return DEFAULT_LIMITS;
  return {
    maxFrameBytes: l.max_frame_bytes,
    maxHeaderBytes: l.max_header_bytes,
    maxKeys: l.max_keys,
    maxListItems: l.max_list_items,
  };
}

const label = (entry) => JSON.stringify(entry.frame ?? entry.frame_hex ?? entry.frame_repeat?.slice(0, 3)).slice(0, 60);

for (const entry of vectors.valid) {
  test(`valid ${label(entry)}`, () => {
    const limits = limitsOf(entry);
    const command = decode(bytesOf(entry, "frame"), limits);
    assert.deepEqual(
      [...command.header].map(([k, v]) => [k, typeof v === "string" ? v : [...v]]),
      entry.header,
    );
    const encoded = encode(command, limits);
    if (entry.body_length !== undefined) {
      assert.equal(command.body.length, entry.body_length);
      assert.equal(encoded.length, entry.encoded_length);
    } else {
      assert.deepEqual(command.body, bytesOf(entry, "body"));
      assert.deepEqual(encoded, bytesOf(entry, "encoded"));
      // A Command built from the decoded pairs writes the same frame.
      assert.deepEqual(encode(new Command(entry.header, command.body), limits), encoded);
    }
  });
}

for (const entry of vectors.invalid) {
  test(`invalid ${label(entry)} → ${entry.code} at ${entry.offset}`, () => {
    assert.throws(
      () => decode(bytesOf(entry, "frame"), limitsOf(entry)),
      (error) => {
        assert.ok(error instanceof ProtocolError, String(error));
        assert.equal(error.code, entry.code, error.message);
        assert.equal(error.offset, entry.offset, error.message);
        return true;
      },
    );
  });
}

for (const entry of vectors.unencodable) {
  test(`unencodable ${JSON.stringify(entry.header).slice(0, 60)} → ${entry.code}`, () => {
    assert.throws(
      () => encode(new Command(entry.header), limitsOf(entry)),
      (error) => error instanceof ProtocolError && error.code === entry.code,
    );
  });
}

test("a text frame decodes as its UTF-8 bytes", () => {
  const command = decode("+c=café;été");
  assert.equal(command.name, "café");
  assert.equal(command.text(), "été");
});
