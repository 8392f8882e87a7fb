/** How the console shows values. */
import type { RecordBatch, Schema } from "apache-arrow";

export function bytes(n: number): string {
  if (n < 1024) return `${n} B`;
  const units = ["KiB", "MiB", "GiB", "TiB"];
  let v = n / 1024;
  let i = 0;
  while (v >= 1024 && i < units.length - 1) {
    v /= 1024;
    i++;
  }
  return `${v.toFixed(v < 10 ? 1 : 0)} ${units[i]}`;
}

export function count(n: number): string {
  return n.toLocaleString("en-US");
}

export function when(value: unknown): string {
  if (value === null || value === undefined) return "";
  const d = value instanceof Date ? value : new Date(String(value));
  return Number.isNaN(d.getTime()) ? String(value) : d.toISOString().replace("T", " ").replace(/\.\d+Z$/, "Z");
}

export function cell(value: unknown): string {
  if (value === null || value === undefined) return "null";
  if (typeof value === "bigint") return value.toString();
  if (value instanceof Date) return value.toISOString();
  if (value instanceof Uint8Array) return `0x${Array.from(value.subarray(0, 16), (b) => b.toString(16).padStart(2, "0")).join("")}${value.length > 16 ? "…" : ""}`;
  if (typeof value === "object") return JSON.stringify(value, (_k, v: unknown) => (typeof v === "bigint" ? v.toString() : v));
  return String(value);
}

/** Rows of `batch` as arrays of display strings, in the order of `schema`'s fields. */
export function rows(batch: RecordBatch, schema: Schema): string[][] {
  const columns = schema.fields.map((_f, j) => batch.getChildAt(j));
  const out: string[][] = [];
  for (let i = 0; i < batch.numRows; i++) out.push(columns.map((c) => cell(c?.get(i))));
  return out;
}

/** Element helper: tag, attributes, children. */
export function el<K extends keyof HTMLElementTagNameMap>(
  tag: K,
  attrs: Record<string, string> = {},
  ...children: Array<Node | string>
): HTMLElementTagNameMap[K] {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "class") e.className = v;
    else e.setAttribute(k, v);
  }
  e.append(...children);
  return e;
}

export function rate(bytesPerSecond: number): string {
  return `${bytes(Math.round(bytesPerSecond))}/s`;
}
