// Vectors for BlazeDB documents and query.nearest. Hand-written beside the generated client; Node's standard
// library only. A Float32Array anywhere in a request is sent as base64 of its little-endian bytes (what a
// `$vector` holds); `vector(values)` makes the document value, `floats(value)` reads one back.

/** Base64 of the little-endian float32 form of `values` (a Float32Array, or any array of numbers). */
export function encode(values) {
  const f32 = values instanceof Float32Array ? values : Float32Array.from(values);
  const bytes = Buffer.from(f32.buffer, f32.byteOffset, f32.byteLength);
  if (os_is_big_endian()) {
    const copy = Buffer.from(bytes);
    copy.swap32();
    return copy.toString('base64');
  }
  return bytes.toString('base64');
}

/** The document value of a vector: `{$vector: base64 of little-endian float32}`. */
export function vector(values) {
  return { $vector: encode(values) };
}

/** The components of a vector value as read (`{$vector: base64}` or `{$vector: [numbers]}`, or the inner value). */
export function floats(value) {
  const inner = value !== null && typeof value === 'object' && !Array.isArray(value) ? value.$vector : value;
  if (typeof inner === 'string') {
    const bytes = Buffer.from(inner, 'base64');
    if (os_is_big_endian()) bytes.swap32();
    return new Float32Array(bytes.buffer.slice(bytes.byteOffset, bytes.byteOffset + bytes.byteLength));
  }
  return Float32Array.from(inner);
}

/** `JSON.stringify`'s replacer: Float32Arrays as base64 text, other typed arrays as arrays of numbers. */
export function jsonReplacer(_key, value) {
  if (value instanceof Float32Array) return encode(value);
  if (ArrayBuffer.isView(value) && !(value instanceof DataView)) return Array.from(value);
  return value;
}

function os_is_big_endian() {
  return new Uint8Array(new Uint32Array([1]).buffer)[0] === 0;
}
