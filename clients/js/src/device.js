// The multi-selection device (docs/reference/client-bundle.md, "What the device computes"): the
// code signal (the best codebook item by the true scores, sent by exact C-ary randomised
// response), or the lattice signal (embedding, L1 clip, lattice point, exact discrete Laplace
// noise), from the platform CSPRNG (integers: no floating point on the privacy path), and the local
// re-rank. Only the signal ever leaves the device.

import { webcrypto } from 'node:crypto';

export { loadBundle } from './bundle.js';

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
  const f = Math.min(1, radius / Math.max(norm, 2 ** -1022)); // 2^-1022: the Python reference's floor, bit for bit
  return Float64Array.from(e, (x) => x * f);
}

// round(x) with ties to even, for the lattice coordinates (|x| far below 2^52, so x − floor(x) is exact).
function roundHalfEven(x) {
  const f = Math.floor(x);
  const diff = x - f;
  if (diff > 0.5) return f + 1;
  if (diff < 0.5) return f;
  return f % 2 === 0 ? f : f + 1;
}

// The lattice point of a clipped embedding: round(e_j / g), ties to even, then pulled into the
// integer L1 ball of radius K: while over, the coordinate of largest magnitude (the first on ties)
// steps one toward 0. Returns BigInts.
export function latticePoint(clipped, gridStep, latticeRadius) {
  const a = Array.from(clipped, (x) => roundHalfEven(x / gridStep));
  let excess = a.reduce((acc, v) => acc + Math.abs(v), 0) - latticeRadius;
  while (excess > 0) {
    let j = 0;
    for (let i = 1; i < a.length; i++) if (Math.abs(a[i]) > Math.abs(a[j])) j = i;
    a[j] -= a[j] > 0 ? 1 : -1;
    excess -= 1;
  }
  return a.map(BigInt);
}

// The exact rational of a finite positive double: [numerator, denominator] as BigInts, in lowest terms.
function exactRational(x) {
  const view = new DataView(new ArrayBuffer(8));
  view.setFloat64(0, x);
  const bits = view.getBigUint64(0);
  const exponent = Number((bits >> 52n) & 0x7ffn);
  let mantissa = bits & ((1n << 52n) - 1n);
  let power = exponent === 0 ? -1074 : exponent - 1075;
  if (exponent !== 0) mantissa |= 1n << 52n;
  while (mantissa % 2n === 0n && power < 0) { mantissa /= 2n; power += 1; }
  return power >= 0 ? [mantissa << BigInt(power), 1n] : [mantissa, 1n << BigInt(-power)];
}

function gcd(a, b) {
  while (b !== 0n) [a, b] = [b, a % b];
  return a;
}

// [s, t] in lowest terms with s/t = epsilon / sensitivity exactly (epsilon's exact rational).
export function rate(epsilon, sensitivity) {
  const [num, den] = exactRational(epsilon);
  const t0 = den * BigInt(sensitivity);
  const g = gcd(num, t0);
  return [num / g, t0 / g];
}

// A stream over 32-bit words: `randomWords(n)` returns n words (default: the CSPRNG), drawn 256 at a time.
export function wordStream(randomWords = cryptoWords) {
  let buf = new Uint32Array(0);
  let at = 0;
  return () => {
    if (at === buf.length) { buf = randomWords(256); at = 0; }
    if (at >= buf.length) throw new RangeError('the random words ran out; expected enough words for the draw');
    return buf[at++];
  };
}

// A fixed word sequence (test vectors) as a stream that throws when it runs out.
export function fixedWords(words) {
  let at = 0;
  return () => {
    if (at >= words.length) throw new RangeError(`the random words ran out after ${words.length}; expected enough words for the draw`);
    return words[at++];
  };
}

// A uniform integer in [0, n): ceil(b/32) words (b the bit length of n − 1), first word most
// significant, masked to b bits, retried while ≥ n. n = 1 takes no word.
// `next()` returns a word as a Number; below 2^32 the draw stays in Numbers (exact there).
export function uniformBelow(n, next) {
  if (n === 1n) return 0n;
  if (n <= 4294967296n) {
    const m = Number(n);
    const bits = 32 - Math.clz32(m - 1);
    const mask = bits === 32 ? 0xffffffff : (1 << bits) - 1;
    for (;;) {
      const x = (next() & mask) >>> 0;
      if (x < m) return BigInt(x);
    }
  }
  const b = (n - 1n).toString(2).length;
  const count = Math.ceil(b / 32);
  const mask = (1n << BigInt(b)) - 1n;
  for (;;) {
    let x = 0n;
    for (let i = 0; i < count; i++) x = (x << 32n) | BigInt(next());
    x &= mask;
    if (x < n) return x;
  }
}

// Bernoulli(exp(−num/den)) (Canonne–Kamath–Steinke Algorithm 1).
export function bernoulliExp(num, den, next) {
  while (num > den) {
    if (!bernoulliExp(1n, 1n, next)) return false;
    num -= den;
  }
  let k = 1n;
  while (uniformBelow(den * k, next) < num) k += 1n;
  return k % 2n === 1n;
}

// One draw with P(x) ∝ exp(−|x|·s/t) on the integers (CKS Algorithm 2), a BigInt.
export function discreteLaplace(s, t, next) {
  for (;;) {
    const u = uniformBelow(t, next);
    if (!bernoulliExp(u, t, next)) continue;
    let v = 0n;
    while (bernoulliExp(1n, 1n, next)) v += 1n;
    const y = (u + t * v) / s;
    const negative = uniformBelow(2n, next) < 1n;
    if (negative && y === 0n) continue;
    return negative ? -y : y;
  }
}

export const SIGNAL_LIMIT = (1n << 53n) - 1n;

// The lattice signal of a clipped embedding: its lattice point + discrete Laplace noise with
// P(x) ∝ exp(−|x|·ε/Δ), Δ = 2K, coordinate 0 first, clamped to ±(2^53 − 1). BigInts.
export function latticeSignal(clipped, epsilon, gridStep, latticeRadius, next) {
  if (!(Number.isFinite(epsilon) && epsilon > 0)) throw new RangeError(`epsilon must be a positive finite number, got ${epsilon}`);
  const a = latticePoint(clipped, gridStep, latticeRadius);
  const [s, t] = rate(epsilon, 2 * latticeRadius);
  return a.map((v) => {
    const z = v + discreteLaplace(s, t, next);
    return z > SIGNAL_LIMIT ? SIGNAL_LIMIT : z < -SIGNAL_LIMIT ? -SIGNAL_LIMIT : z;
  });
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

// The signal sent to the server: the history's lattice signal, BigInts. `randomWords(n)` returns
// n uniform 32-bit words (default: the platform CSPRNG, crypto.getRandomValues).
export function signal(bundle, history, epsilon, randomWords = cryptoWords) {
  return latticeSignal(embedding(bundle, history), epsilon, bundle.gridStep, bundle.latticeRadius, wordStream(randomWords));
}

// x W1 for the history's rows: the sum of their rows of W1, in row order.
function hidden(bundle, rows) {
  const u = new Float64Array(bundle.w2.rows);
  const { w1 } = bundle;
  for (const r of rows) for (let k = w1.indptr[r]; k < w1.indptr[r + 1]; k++) u[w1.indices[k]] += w1.data[k];
  return u;
}

// The true score of item row j: (x W1) · column j of W2, down the column; −Infinity if seen.
function rowScore(bundle, u, seen, j) {
  if (seen.has(j)) return -Infinity;
  const c = bundle.w2Columns;
  let s = 0;
  for (let k = c.indptr[j]; k < c.indptr[j + 1]; k++) s += u[c.rows[k]] * c.data[k];
  return s;
}

// True SANSA scores (x W1 W2) of `itemIds` for the history; −Infinity for history items.
export function scores(bundle, history, itemIds) {
  const rows = historyRows(bundle, history);
  const u = hidden(bundle, rows);
  const seen = new Set(rows);
  return itemIds.map((id) => {
    const j = bundle.index.get(id);
    if (j === undefined) throw new Error(`the server returned item ${JSON.stringify(id)}, which is not in the client bundle; expected the bundle of the artifact the server serves`);
    return rowScore(bundle, u, seen, j);
  });
}

// The history's code: the index of its best codebook item by the true scores (seen items
// −Infinity), the earlier on ties, 0 when every item is seen.
export function code(bundle, history) {
  const rows = historyRows(bundle, history);
  const u = hidden(bundle, rows);
  const seen = new Set(rows);
  return localChoice(Array.from(bundle.codebook, (j) => rowScore(bundle, u, seen, j)));
}

// C-ary randomised response of `index` < `size` at epsilon, exactly: rounds of uniformBelow(C),
// the round's Y kept if it is `index`, else kept iff Bernoulli(exp(−epsilon)) (epsilon's exact
// rational); a round that keeps nothing starts again. P(index) = e^ε/(e^ε + C − 1). A Number.
export function randomizedResponse(index, size, epsilon, next) {
  if (!(Number.isFinite(epsilon) && epsilon > 0)) throw new RangeError(`epsilon must be a positive finite number, got ${epsilon}`);
  if (!(Number.isInteger(size) && size >= 2 && Number.isInteger(index) && index >= 0 && index < size)) {
    throw new RangeError(`the code must be an integer in [0, ${size}) and the codebook size ≥ 2; got ${index} of ${size}`);
  }
  const [s, t] = exactRational(epsilon);
  const c = BigInt(size);
  const x = BigInt(index);
  for (;;) {
    const y = uniformBelow(c, next);
    if (y === x || bernoulliExp(s, t, next)) return Number(y);
  }
}

// The code signal sent to the server by default: the history's code by randomised response.
export function codeSignal(bundle, history, epsilon, randomWords = cryptoWords) {
  return randomizedResponse(code(bundle, history), bundle.codebook.length, epsilon, wordStream(randomWords));
}

// The index of the best score, ties to the earlier item (the first if every item is −Infinity).
export function localChoice(values) {
  if (values.length === 0) throw new RangeError('no items to choose from');
  let best = 0;
  for (let i = 1; i < values.length; i++) if (values[i] > values[best]) best = i;
  return best;
}
