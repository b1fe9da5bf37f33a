// Loads a client bundle (docs/reference/client-bundle.md): manifest.json, item_ids.json and the
// .npy files, each checked against the manifest's sha256.

import { createHash } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';

import { parseNpy } from './npy.js';

const FORMAT = 'recsvc-client-bundle';
const FORMAT_VERSION = 3;
const GRID_STEPS = 4096; // grid steps per clip radius R (docs/reference/client-bundle.md)
const FILES = ['item_ids.json', 'codebook.json', 'embedding.npy', 'w1_indptr.npy', 'w1_indices.npy', 'w1_data.npy',
  'w2_indptr.npy', 'w2_indices.npy', 'w2_data.npy'];

function bad(dir, what) {
  return new Error(`client bundle ${dir}: ${what}`);
}

function readChecked(dir, manifest, name) {
  const want = manifest.files?.[name];
  if (typeof want !== 'string') throw bad(dir, `manifest.json lists no sha256 for ${name}`);
  let bytes;
  try {
    bytes = readFileSync(join(dir, name));
  } catch (err) {
    throw bad(dir, `cannot read ${name} (${err.code ?? err.message}); expected the file the manifest lists`);
  }
  const got = createHash('sha256').update(bytes).digest('hex');
  if (got !== want) throw bad(dir, `${name} has sha256 ${got} but manifest.json says ${want}; the bundle was altered`);
  return bytes;
}

function csr(dir, manifest, prefix, rows) {
  const indptr = parseNpy(readChecked(dir, manifest, `${prefix}_indptr.npy`), `${prefix}_indptr.npy`).data;
  const indices = parseNpy(readChecked(dir, manifest, `${prefix}_indices.npy`), `${prefix}_indices.npy`).data;
  const data = parseNpy(readChecked(dir, manifest, `${prefix}_data.npy`), `${prefix}_data.npy`).data;
  if (rows !== null && indptr.length !== rows + 1) throw bad(dir, `${prefix}_indptr.npy has ${indptr.length} entries, expected ${rows + 1}`);
  if (indices.length !== data.length || indptr[indptr.length - 1] !== data.length) {
    throw bad(dir, `${prefix}: indptr, indices and data disagree on the number of nonzeros`);
  }
  return { indptr, indices, data, rows: indptr.length - 1 };
}

// Column-major copy of a CSR matrix with `cols` columns: one item's score reads only its column.
function toColumns(m, cols) {
  const counts = new Float64Array(cols + 1);
  for (let k = 0; k < m.indices.length; k++) counts[m.indices[k] + 1] += 1;
  for (let j = 0; j < cols; j++) counts[j + 1] += counts[j];
  const next = Float64Array.from(counts.subarray(0, cols));
  const rowOf = new Int32Array(m.data.length);
  const data = new Float64Array(m.data.length);
  for (let i = 0; i < m.rows; i++) {
    for (let k = m.indptr[i]; k < m.indptr[i + 1]; k++) {
      const at = next[m.indices[k]]++;
      rowOf[at] = i;
      data[at] = m.data[k];
    }
  }
  return { indptr: counts, rows: rowOf, data };
}

// Reads the bundle in `dir` (an artifact's client/ directory).
export function loadBundle(dir) {
  let manifest;
  try {
    manifest = JSON.parse(readFileSync(join(dir, 'manifest.json'), 'utf8'));
  } catch (err) {
    throw bad(dir, `cannot read manifest.json (${err.code ?? err.message}); expected a recsvc client bundle directory`);
  }
  const old = { 1: 'a float signal', 2: 'the lattice signal without the codebook' };
  if (manifest.format === FORMAT && manifest.format_version in old) {
    throw bad(dir, `manifest.json is format_version ${manifest.format_version} (${old[manifest.format_version]}), which servers refuse; expected version ${FORMAT_VERSION} (the code signal's codebook): rebuild the artifact with \`recsvc prep\``);
  }
  if (manifest.format !== FORMAT || manifest.format_version !== FORMAT_VERSION) {
    throw bad(dir, `manifest.json is format ${manifest.format} version ${manifest.format_version}; expected ${FORMAT} version ${FORMAT_VERSION}`);
  }
  for (const name of FILES) if (!(name in (manifest.files ?? {}))) throw bad(dir, `manifest.json lists no ${name}`);
  const itemIds = JSON.parse(new TextDecoder().decode(readChecked(dir, manifest, 'item_ids.json')));
  const n = itemIds.length;
  const emb = parseNpy(readChecked(dir, manifest, 'embedding.npy'), 'embedding.npy');
  const d = manifest.dim;
  if (n !== manifest.num_items || emb.dtype !== '<f8' || emb.shape.length !== 2 || emb.shape[0] !== n || emb.shape[1] !== d) {
    throw bad(dir, `embedding.npy has shape (${emb.shape.join(', ')}) and item_ids.json ${n} ids; expected (${manifest.num_items}, ${d})`);
  }
  if (!(Number.isFinite(manifest.radius) && manifest.radius > 0)) throw bad(dir, `radius ${manifest.radius}; expected a positive number`);
  const gridStep = manifest.radius / GRID_STEPS;
  const latticeRadius = GRID_STEPS + Math.floor(d / 2);
  if (manifest.grid_step !== gridStep || manifest.lattice_radius !== latticeRadius) {
    throw bad(dir, `grid_step ${manifest.grid_step} and lattice_radius ${manifest.lattice_radius}; expected ${gridStep} and ${latticeRadius} (R/4096 and 4096 + floor(d/2))`);
  }
  // The version is sha256 of E's float64 little-endian bytes, then R and the grid step as float64
  // little-endian and the lattice radius as int64 little-endian.
  const tail = new DataView(new ArrayBuffer(24));
  tail.setFloat64(0, manifest.radius, true);
  tail.setFloat64(8, gridStep, true);
  tail.setBigInt64(16, BigInt(latticeRadius), true);
  const version = createHash('sha256').update(new Uint8Array(emb.data.buffer)).update(new Uint8Array(tail.buffer)).digest('hex');
  if (version !== manifest.embedding_version) {
    throw bad(dir, `embedding.npy, radius and grid hash to ${version}, not the manifest's embedding_version; expected the bundle as \`recsvc prep\` wrote it`);
  }
  const w1 = csr(dir, manifest, 'w1', n);
  const w2 = csr(dir, manifest, 'w2', null);
  const index = new Map(itemIds.map((id, row) => [id, row]));
  // The codebook: its bytes' sha256 (checked above against files) is the codebook_version.
  const bookBytes = readChecked(dir, manifest, 'codebook.json');
  const codebookIds = JSON.parse(new TextDecoder().decode(bookBytes));
  if (manifest.signal !== 'code' || !Array.isArray(codebookIds) || codebookIds.length !== manifest.code_size || codebookIds.length < 2
    || new Set(codebookIds).size !== codebookIds.length || !codebookIds.every((id) => index.has(id))) {
    throw bad(dir, `codebook.json holds ${codebookIds.length} ids and the manifest says signal ${manifest.signal}, code_size ${manifest.code_size}; expected signal "code" and code_size distinct item ids (≥ 2)`);
  }
  const codebookVersion = createHash('sha256').update(bookBytes).digest('hex');
  if (codebookVersion !== manifest.codebook_version) throw bad(dir, `codebook.json hashes to ${codebookVersion}, not the manifest's codebook_version; expected the bundle as \`recsvc prep\` wrote it`);
  return {
    version: manifest.embedding_version,
    dim: d,
    radius: manifest.radius,
    gridStep,
    latticeRadius,
    itemIds,
    index,
    embedding: emb.data,
    w1,
    w2,
    w2Columns: toColumns(w2, n),
    codebook: Int32Array.from(codebookIds, (id) => index.get(id)),
    codebookIds,
    codebookVersion,
  };
}
