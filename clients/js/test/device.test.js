// The device's pure parts: the .npy reader, the exact sampler, the lattice signal on the shared
// test vectors (docs/reference/multiselect-vectors.json), the clip and the local choice, on
// values whose answers are known exactly.

import assert from 'node:assert/strict';
import { test } from 'node:test';

import { readFileSync } from 'node:fs';

import {
  bernoulliExp, clipL1, code, discreteLaplace, fixedWords, latticePoint, latticeSignal, localChoice, randomizedResponse, rate, scores,
  uniformBelow, wordStream,
} from '../src/device.js';
import { parseNpy } from '../src/npy.js';

function npyBytes(descr, shape, body) {
  let header = `{'descr': '${descr}', 'fortran_order': False, 'shape': (${shape.join(', ')}${shape.length === 1 ? ',' : ''}), }`;
  while ((10 + header.length + 1) % 64 !== 0) header += ' ';
  header += '\n';
  const out = new Uint8Array(10 + header.length + body.byteLength);
  out.set([0x93, ...Buffer.from('NUMPY'), 1, 0]);
  new DataView(out.buffer).setUint16(8, header.length, true);
  out.set(Buffer.from(header, 'latin1'), 10);
  out.set(new Uint8Array(body.buffer, body.byteOffset, body.byteLength), 10 + header.length);
  return out;
}

test('the npy reader returns the dtype, shape and values', () => {
  const f = parseNpy(npyBytes('<f8', [2, 3], new Float64Array([1, 2, 3, 4.5, -5, 6])));
  assert.deepEqual(f.shape, [2, 3]);
  assert.deepEqual(Array.from(f.data), [1, 2, 3, 4.5, -5, 6]);
  const i = parseNpy(npyBytes('<i8', [3], new BigInt64Array([0n, 7n, 2n ** 40n])));
  assert.deepEqual(Array.from(i.data), [0, 7, 2 ** 40]);
  const j = parseNpy(npyBytes('<i4', [2], new Int32Array([5, -1])));
  assert.deepEqual(Array.from(j.data), [5, -1]);
});

test('the npy reader refuses what it cannot read, naming the file', () => {
  assert.throws(() => parseNpy(new Uint8Array(20), 'x.npy'), /x\.npy: no \.npy magic string/);
  assert.throws(() => parseNpy(npyBytes('>f8', [1], new Float64Array([1]))), /dtype >f8/);
  assert.throws(() => parseNpy(npyBytes('<f8', [3], new Float64Array([1]))), /8 data bytes for shape \(3\)/);
});

const VECTORS = JSON.parse(readFileSync(new URL('../../../docs/reference/multiselect-vectors.json', import.meta.url), 'utf8'));

// The device's path from the bundle's factors, as src/device.js embed + clipL1 compute it.
function clippedOf(v) {
  const d = v.factors[0].length;
  const e = new Float64Array(d);
  for (const r of [...new Set(v.history_rows)].sort((a, b) => a - b)) for (let j = 0; j < d; j++) e[j] += v.factors[r][j];
  if (v.history_rows.length) for (let j = 0; j < d; j++) e[j] /= Math.sqrt(new Set(v.history_rows).size);
  return clipL1(e, v.radius);
}

test('the shared test vectors give the same lattice point and signal, bit for bit, from exactly their words', () => {
  assert.ok(VECTORS.vectors.length >= 5);
  for (const v of VECTORS.vectors) {
    const clipped = clippedOf(v);
    clipped.forEach((x, j) => assert.ok(Math.abs(x - v.clipped[j]) < 1e-12, `${v.name}: clipped[${j}]`));
    assert.equal(v.grid_step, v.radius / 4096);
    assert.deepEqual(latticePoint(clipped, v.grid_step, v.lattice_radius).map(Number), v.point, v.name);
    const signal = latticeSignal(clipped, v.epsilon, v.grid_step, v.lattice_radius, fixedWords(v.words));
    assert.deepEqual(signal.map(Number), v.signal, v.name);
    const fewer = fixedWords(v.words.slice(0, -1));
    assert.throws(() => latticeSignal(clipped, v.epsilon, v.grid_step, v.lattice_radius, fewer), /ran out/, v.name);
  }
  for (const p of VECTORS.pull_in) {
    const asFloats = Float64Array.from(p.point); // grid step 1: the point is its own rounding
    assert.deepEqual(latticePoint(asFloats, 1, p.lattice_radius).map(Number), p.pulled);
  }
});

// A bundle-shaped object of the vectors' dense model: W1 as CSR, W2 by columns (nonzeros only).
function codeBundle(model, codebook) {
  const n = model.w1.length;
  const w1 = { indptr: [0], indices: [], data: [] };
  for (const row of model.w1) {
    row.forEach((x, j) => { if (x !== 0) { w1.indices.push(j); w1.data.push(x); } });
    w1.indptr.push(w1.data.length);
  }
  const cols = { indptr: [0], rows: [], data: [] };
  for (let j = 0; j < n; j++) {
    model.w2.forEach((row, i) => { if (row[j] !== 0) { cols.rows.push(i); cols.data.push(row[j]); } });
    cols.indptr.push(cols.data.length);
  }
  const ids = Array.from({ length: n }, (_, j) => `i${j}`);
  return { index: new Map(ids.map((id, j) => [id, j])), w1, w2: { rows: model.w2.length }, w2Columns: cols, codebook: Int32Array.from(codebook), ids };
}

test('the shared code vectors give the same scores, code and sent index, bit for bit, from exactly their words', () => {
  assert.ok(VECTORS.code_vectors.length >= 5);
  for (const v of VECTORS.code_vectors) {
    const b = codeBundle(VECTORS.code_model, v.codebook);
    const history = v.history_rows.map((r) => b.ids[r]);
    const got = scores(b, history, v.codebook.map((r) => b.ids[r])).map((x) => (x === -Infinity ? null : x));
    assert.deepEqual(got, v.scores, v.name);
    assert.equal(code(b, history), v.code, v.name);
    assert.equal(randomizedResponse(v.code, v.codebook.length, v.epsilon, fixedWords(v.words)), v.sent, v.name);
    assert.throws(() => randomizedResponse(v.code, v.codebook.length, v.epsilon, fixedWords(v.words.slice(0, -1))), /ran out/, v.name);
  }
  assert.throws(() => randomizedResponse(3, 3, 1, fixedWords([])), /the code must be an integer in \[0, 3\)/);
});

test('randomised response keeps the code with probability e^eps / (e^eps + C - 1)', () => {
  const next = wordStream();
  const n = 20000;
  let kept = 0;
  for (let i = 0; i < n; i++) if (randomizedResponse(2, 5, 1, next) === 2) kept++;
  const p = Math.E / (Math.E + 4);
  assert.ok(Math.abs(kept / n - p) < 0.015, `P = ${kept / n}`); // sd ≈ 0.0035
});

test('the rate is epsilon / delta exactly, in lowest terms', () => {
  assert.deepEqual(rate(1, 8224), [1n, 8224n]);
  assert.deepEqual(rate(0.5, 8), [1n, 16n]);
  assert.deepEqual(rate(0.1, 8224), [3602879701896397n, 296300826683959672832n]); // 0.1's double is 3602879701896397/2^55
  assert.deepEqual(rate(6, 4), [3n, 2n]);
});

test('uniforms mask the words to the bit length and reject what is too large', () => {
  assert.equal(uniformBelow(1n, fixedWords([])), 0n); // no word taken
  assert.equal(uniformBelow(5n, fixedWords([0xfffffff8, 7, 4])), 0n); // 0 after masking to 3 bits
  assert.equal(uniformBelow(5n, fixedWords([7, 4])), 4n); // 7 ≥ 5 is rejected
  assert.equal(uniformBelow(2n ** 40n, fixedWords([0xffffff01, 2])), (1n << 32n) + 2n); // two words, the first most significant, masked
});

test('Bernoulli(exp(-gamma)) and the discrete Laplace follow their laws', () => {
  const next = wordStream();
  let hits = 0;
  const n = 20000;
  for (let i = 0; i < n; i++) if (bernoulliExp(3n, 2n, next)) hits++;
  assert.ok(Math.abs(hits / n - Math.exp(-1.5)) < 0.015, `P = ${hits / n}`); // sd ≈ 0.0029
  const counts = new Map();
  for (let i = 0; i < n; i++) {
    const x = Number(discreteLaplace(1n, 2n, next));
    counts.set(x, (counts.get(x) ?? 0) + 1);
  }
  const q = Math.exp(-0.5);
  for (const x of [-2, -1, 0, 1, 2]) {
    const p = ((1 - q) / (1 + q)) * q ** Math.abs(x);
    assert.ok(Math.abs((counts.get(x) ?? 0) / n - p) < 0.015, `P(${x})`);
  }
});

test('the clip scales onto the L1 ball and leaves the inside alone', () => {
  assert.deepEqual(Array.from(clipL1(new Float64Array([3, -1]), 2)), [1.5, -0.5]);
  assert.deepEqual(Array.from(clipL1(new Float64Array([0.5, -1]), 2)), [0.5, -1]);
  assert.deepEqual(Array.from(clipL1(new Float64Array([0, 0]), 2)), [0, 0]);
});

test('the local choice keeps the best, ties to the earlier item', () => {
  assert.equal(localChoice([0.2, 0.9, 0.9]), 1);
  assert.equal(localChoice([-Infinity, 0.1]), 1);
  assert.equal(localChoice([-Infinity, -Infinity]), 0);
  assert.throws(() => localChoice([]), /no items/);
});
