// Blobs as Node streams: read a blob as a Readable, upload a Readable in-band (blob.upload, blob.append, blob.finish).
// Hand-written beside the generated client; Node's standard library only.
import { Readable } from 'node:stream';

/** Most bytes one blob.read returns. */
export const READ_MAX = 4 << 20;

/**
 * Blob `blob` of database `db` as a Readable of Buffers, from `start` (default 0) to its end, `piece` bytes per
 * blob.read (at most 4 MiB). Each piece is asked for when the consumer wants more, so a blob of any size streams
 * without being held.
 */
export function blobReadStream(client, { db, blob, start = 0, piece = READ_MAX }) {
  if (!(piece > 0 && piece <= READ_MAX)) throw new RangeError(`piece must be 1 to ${READ_MAX} bytes`);
  async function* pieces() {
    let offset = start;
    for (;;) {
      const result = await client.blob.read({ db, blob, offset, length: piece });
      if (result.bytes === 0) return;
      offset += result.bytes;
      yield Buffer.from(result.data, 'base64');
    }
  }
  return Readable.from(pieces(), { objectMode: false });
}

/**
 * Stores what `source` (a Readable or any async iterable of Buffers or Uint8Arrays) yields as a blob of `db`,
 * in blob.append calls of at most `piece` bytes; resolves to what blob.finish returns (its `ref` is what a
 * document holds to refer to the blob). If reading `source` or a call fails, the upload is aborted (blob.abort)
 * before the error is thrown, so its slot is free at once.
 */
export async function uploadBlob(client, { db, type, piece = 1 << 20 }, source) {
  if (!(piece > 0 && piece <= READ_MAX)) throw new RangeError(`piece must be 1 to ${READ_MAX} bytes`);
  const { upload } = await client.blob.upload(type === undefined ? { db } : { db, type });
  let pending = [];
  let size = 0;
  const flush = async () => {
    if (size === 0) return;
    const data = Buffer.concat(pending, size);
    pending = [];
    size = 0;
    for (let i = 0; i < data.length; i += piece) {
      await client.blob.append({ db, upload, data: data.subarray(i, i + piece).toString('base64') });
    }
  };
  try {
    for await (const chunk of source) {
      const buffer = Buffer.isBuffer(chunk) ? chunk : Buffer.from(chunk);
      pending.push(buffer);
      size += buffer.length;
      if (size >= piece) await flush();
    }
    await flush();
    return await client.blob.finish({ db, upload });
  } catch (error) {
    // Ended already (a failed append ends it) or the connection is gone (which ends it too): nothing to add.
    await client.blob.abort({ db, upload }).catch(() => {});
    throw error;
  }
}
