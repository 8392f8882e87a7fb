/**
 * Arrow payloads (docs/dataset-protocol.md §6): the schema travels once, as one IPC schema
 * message in the channel's headers; each data message is one IPC record batch message.
 * Concatenated, they are an IPC stream, which apache-arrow reads batch by batch.
 */
import { DataType, type RecordBatch, RecordBatchReader, type Schema, Table, tableToIPC } from "apache-arrow";

/** IPC stream end: continuation marker, zero length. */
const EOS_BYTES = 8;

/** The IPC schema message of `schema` (what `aqds-schema-4b1f0a` carries). */
export function schemaMessage(schema: Schema): Uint8Array {
  const stream = tableToIPC(new Table(schema), "stream");
  return stream.subarray(0, stream.length - EOS_BYTES);
}

/** One IPC record batch message per batch, without the schema (data messages of a write).
 * Dictionary-encoded columns are refused: a data message carries no dictionary (the
 * service asks for them decoded). */
export function batchMessages(table: Table): Uint8Array[] {
  const dictionaries = table.schema.fields.filter((f) => DataType.isDictionary(f.type)).map((f) => f.name);
  if (dictionaries.length)
    throw new Error(
      `columns ${dictionaries.join(", ")} are dictionary-encoded (tableFromArrays does that to strings); build them with vectorFromArray(values, new Utf8()) so each batch travels as one record batch message`,
    );
  const head = schemaMessage(table.schema).length;
  return table.batches.map((batch: RecordBatch) => {
    const stream = tableToIPC(new Table([batch]), "stream");
    return stream.slice(head, stream.length - EOS_BYTES);
  });
}

/** The schema inside an IPC schema message. */
export async function readSchema(message: Uint8Array): Promise<Schema> {
  const reader = await RecordBatchReader.from(message);
  await reader.open();
  return reader.schema;
}

/** Record batches from a schema message and the data messages `payloads` yields. */
export async function* decodeBatches(schema: Uint8Array, payloads: AsyncIterable<Uint8Array>): AsyncGenerator<RecordBatch> {
  async function* stream(): AsyncGenerator<Uint8Array> {
    yield schema;
    yield* payloads;
  }
  const reader = await RecordBatchReader.from(stream());
  await reader.open();
  for await (const batch of reader) yield batch;
}
