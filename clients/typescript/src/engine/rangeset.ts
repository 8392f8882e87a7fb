/** A set of non-negative integers kept as sorted, disjoint half-open ranges: received
 * message numbers, acked numbers, tombstones (G19). Indices are sequential, so these stay a
 * handful of ranges. */
export class RangeSet {
  private starts: number[] = [];
  private stops: number[] = [];

  /** Index of the last range starting at or before `value`, or -1. */
  private find(value: number): number {
    let lo = 0;
    let hi = this.starts.length;
    while (lo < hi) {
      const mid = (lo + hi) >> 1;
      if (this.starts[mid]! <= value) lo = mid + 1;
      else hi = mid;
    }
    return lo - 1;
  }

  get empty(): boolean {
    return this.starts.length === 0;
  }

  has(value: number): boolean {
    const i = this.find(value);
    return i >= 0 && value < this.stops[i]!;
  }

  ranges(): Array<[number, number]> {
    return this.starts.map((s, i) => [s, this.stops[i]!]);
  }

  /** The members in [start, stop) as sorted half-open ranges, clipped to it. */
  rangesWithin(start: number, stop: number): Array<[number, number]> {
    const out: Array<[number, number]> = [];
    let i = Math.max(this.find(start), 0);
    while (i < this.starts.length && this.starts[i]! < stop) {
      const a = Math.max(this.starts[i]!, start);
      const b = Math.min(this.stops[i]!, stop);
      if (a < b) out.push([a, b]);
      i++;
    }
    return out;
  }

  add(value: number): void {
    this.addRange(value, value + 1);
  }

  addRange(start: number, stop: number): void {
    if (start >= stop) return;
    let i = this.find(start);
    if (i >= 0 && this.stops[i]! >= start) start = this.starts[i]!;
    else i++;
    let j = i;
    while (j < this.starts.length && this.starts[j]! <= stop) {
      stop = Math.max(stop, this.stops[j]!);
      j++;
    }
    this.starts.splice(i, j - i, start);
    this.stops.splice(i, j - i, stop);
  }

  /** True if any member lies in [start, stop). */
  overlaps(start: number, stop: number): boolean {
    const i = this.find(stop - 1);
    return i >= 0 && this.stops[i]! > start;
  }

  /** The smallest value >= `base` not in the set. */
  firstGap(base = 0): number {
    const i = this.find(base);
    return i >= 0 && base < this.stops[i]! ? this.stops[i]! : base;
  }

  discardBelow(value: number): void {
    let k = 0;
    while (k < this.starts.length && this.stops[k]! <= value) k++;
    this.starts.splice(0, k);
    this.stops.splice(0, k);
    if (this.starts.length && this.starts[0]! < value) this.starts[0] = value;
  }

  /** The highest member + 1, or 0. */
  top(): number {
    return this.stops.length ? this.stops[this.stops.length - 1]! : 0;
  }
}
