// The device's pure parts: the .npy reader, the 53-bit uniforms, the Laplace noise, the clip and
// the local choice, on values whose answers are known exactly.

import assert from 'node:assert/strict';
import { test } from 'node:test';

import { clipL1, laplaceNoise, localChoice, uniformsFromWords } from '../src/device.js';
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

test('uniforms are (m + 1)/2^53 from 27 + 26 bits of two words, never 0', () => {
  const u = uniformsFromWords(new Uint32Array([0, 0, 0xffffffff, 0xffffffff, 0x80000000, 0]));
  assert.deepEqual(Array.from(u), [2 ** -53, 1, 0.5 + 2 ** -53]);
});

test('Laplace noise is -ln U1 + ln U2 from four words per variate', () => {
  const words = (n) => {
    assert.equal(n, 8);
    return new Uint32Array([0, 0, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0, 0]);
  };
  const z = laplaceNoise(2, words);
  assert.ok(Math.abs(z[0] - 53 * Math.log(2)) < 1e-12);
  assert.ok(Math.abs(z[1] + 53 * Math.log(2)) < 1e-12);
  const many = laplaceNoise(20000);
  const mean = many.reduce((a, x) => a + x, 0) / many.length;
  const absMean = many.reduce((a, x) => a + Math.abs(x), 0) / many.length;
  assert.ok(Math.abs(mean) < 0.05, `mean ${mean}`); // sd of the mean ≈ 0.01
  assert.ok(Math.abs(absMean - 1) < 0.04, `E|X| ${absMean}`); // E|X| = 1, sd ≈ 0.007
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
