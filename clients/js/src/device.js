// The multi-selection device (docs/reference/client-bundle.md, "What the device computes"):
// embedding, L1 clip, Laplace noise from the platform CSPRNG, and the local re-rank. Only the
// signal ever leaves the device.

import { webcrypto } from 'node:crypto';

export { loadBundle } from './bundle.js';

const TWO_26 = 2 ** 26;
const TWO_53 = 2 ** 53;

// The distinct bundle rows of a history, ascending; ids not in the bundle are skipped.
export function historyRows(bundle, history) {
  const rows = new Set();
  for (const id of history) {
    const row = bundle.index.get(String(id));
    if (row !== undefined) rows.add(row);
  }
  return Int32Array.from(rows).sort();
}

// e = sum of the rows' embedding factors / sqrt(|rows|); the zero vector for no rows.
export function embed(bundle, rows) {
  const d = bundle.dim;
  const e = new Float64Array(d);
  if (rows.length === 0) return e;
  for (const r of rows) {
    const base = r * d;
    for (let j = 0; j < d; j++) e[j] += bundle.embedding[base + j];
  }
  const s = Math.sqrt(rows.length);
  for (let j = 0; j < d; j++) e[j] /= s;
  return e;
}

// e scaled onto the L1 ball of radius R (unchanged inside it).
export function clipL1(e, radius) {
  let norm = 0;
  for (const x of e) norm += Math.abs(x);
  const f = Math.min(1, radius / Math.max(norm, Number.MIN_VALUE));
  return Float64Array.from(e, (x) => x * f);
}

// Words m in [0, 2^53) as U = (m + 1)/2^53 in (0, 1], from pairs of 32-bit CSPRNG words: the top
// 27 bits of one and the top 26 of the other.
export function uniformsFromWords(words) {
  const out = new Float64Array(words.length / 2);
  for (let i = 0; i < out.length; i++) {
    const m = (words[2 * i] >>> 5) * TWO_26 + (words[2 * i + 1] >>> 6);
    out[i] = (m + 1) / TWO_53;
  }
  return out;
}

// `count` Laplace(0, 1) variates X − Y, X = −ln U1, Y = −ln U2. `randomWords(n)` returns n
// uniform 32-bit words; the default is the platform CSPRNG (crypto.getRandomValues).
export function laplaceNoise(count, randomWords = cryptoWords) {
  const u = uniformsFromWords(randomWords(4 * count));
  const out = new Float64Array(count);
  for (let j = 0; j < count; j++) out[j] = Math.log(u[2 * j + 1]) - Math.log(u[2 * j]);
  return out;
}

export function cryptoWords(n) {
  const out = new Uint32Array(n);
  for (let at = 0; at < n; at += 16384) webcrypto.getRandomValues(out.subarray(at, Math.min(n, at + 16384)));
  return out;
}

// The clipped embedding of a history.
export function embedding(bundle, history) {
  return clipL1(embed(bundle, historyRows(bundle, history)), bundle.radius);
}

// The signal sent to the server: the clipped embedding + Laplace(2R/ε) per coordinate.
export function signal(bundle, history, epsilon, randomWords = cryptoWords) {
  if (!(Number.isFinite(epsilon) && epsilon > 0)) throw new RangeError(`epsilon must be a positive finite number, got ${epsilon}`);
  const e = embedding(bundle, history);
  const b = (2 * bundle.radius) / epsilon;
  const z = laplaceNoise(e.length, randomWords);
  return Float64Array.from(e, (x, j) => x + b * z[j]);
}

// True SANSA scores (x W1 W2) of `itemIds` for the history; −Infinity for history items.
export function scores(bundle, history, itemIds) {
  const rows = historyRows(bundle, history);
  const u = new Float64Array(bundle.w2.rows);
  const { w1, w2Columns: c } = bundle;
  for (const r of rows) for (let k = w1.indptr[r]; k < w1.indptr[r + 1]; k++) u[w1.indices[k]] += w1.data[k];
  const seen = new Set(rows);
  return itemIds.map((id) => {
    const j = bundle.index.get(id);
    if (j === undefined) throw new Error(`the server returned item ${JSON.stringify(id)}, which is not in the client bundle; expected the bundle of the artifact the server serves`);
    if (seen.has(j)) return -Infinity;
    let s = 0;
    for (let k = c.indptr[j]; k < c.indptr[j + 1]; k++) s += u[c.rows[k]] * c.data[k];
    return s;
  });
}

// The index of the best score, ties to the earlier item (the first if every item is −Infinity).
export function localChoice(values) {
  if (values.length === 0) throw new RangeError('no items to choose from');
  let best = 0;
  for (let i = 1; i < values.length; i++) if (values[i] > values[best]) best = i;
  return best;
}
