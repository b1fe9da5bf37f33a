// The JavaScript device against a live `recsvc serve` (started here on a toy artifact with a
// client bundle, stopped after): the MultiSelect call, the accounting it reports and the re-rank.

import assert from 'node:assert/strict';
import { cpSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { after, before, test } from 'node:test';

import { multiselect, connect } from '../src/client.js';
import { loadBundle, localChoice, scores } from '../src/device.js';
import { cleanup, serve, toyArtifact } from '../testing/live.js';

const HISTORY = ['it3', 'it17', 'it29', 'it17', 'not-an-item'];
let toy, server, client, bundle;

before(async () => {
  toy = toyArtifact();
  server = await serve(toy.dir, toy.artifact, '--budget', '5');
  client = connect(server.target);
  bundle = loadBundle(toy.bundle);
});

after(async () => {
  client?.close();
  await server?.stop();
  if (toy) cleanup(toy.dir);
});

test('MultiSelect returns k distinct items, charges the declared epsilon and the device keeps the best', async () => {
  const r = await multiselect(client, bundle, { userId: 'js-alice', history: HISTORY, epsilon: 0.5, k: 5, requestId: 'js-1' });
  assert.equal(r.itemIds.length, 5);
  assert.equal(new Set(r.itemIds).size, 5);
  assert.ok(r.itemIds.includes(r.itemId));
  const s = scores(bundle, HISTORY, r.itemIds);
  assert.equal(r.itemId, r.itemIds[localChoice(s)]);
  assert.ok(!HISTORY.includes(r.itemId) || s.every((x) => x === -Infinity));
  assert.equal(r.charged, true);
  assert.equal(r.epsilonSpent, 0.5);
  assert.ok(Math.abs(r.budgetRemaining - 4.5) < 1e-9);
  assert.equal(r.replayed, false);

  const again = await multiselect(client, bundle, { userId: 'js-alice', history: HISTORY, epsilon: 0.5, k: 5, requestId: 'js-1' });
  assert.deepEqual(again.itemIds, r.itemIds); // a retry replays the stored answer
  assert.equal(again.replayed, true);
  assert.ok(Math.abs(again.budgetRemaining - 4.5) < 1e-9); // and spends nothing
  await assert.rejects(
    multiselect(client, bundle, { userId: 'js-alice', history: ['it3'], epsilon: 0.5, k: 5, requestId: 'js-1' }),
    /'?"js-1"'? was already sent by this device/,
  );
});

test('without a user id nothing is charged', async () => {
  const r = await multiselect(client, bundle, { history: HISTORY, epsilon: 1, k: 2 });
  assert.equal(r.itemIds.length, 2);
  assert.equal(r.charged, false);
  assert.equal(r.epsilonSpent, 0);
});

test('bad input is refused with INVALID_ARGUMENT', async () => {
  await assert.rejects(
    multiselect(client, { ...bundle, version: 'not-the-version' }, { userId: 'js-bob', history: HISTORY, epsilon: 1, k: 2 }),
    (err) => err.code === 3 && /embedding_version/.test(err.details),
  );
  await assert.rejects(
    multiselect(client, bundle, { userId: 'js-bob', history: HISTORY, epsilon: 1, k: 0 }),
    (err) => err.code === 3,
  );
  await assert.rejects(
    multiselect(client, { ...bundle, gridStep: bundle.gridStep * 2 }, { userId: 'js-bob', history: HISTORY, epsilon: 1, k: 2, signal: 'lattice' }),
    (err) => err.code === 3 && /grid_step .* is not this bundle's/.test(err.details),
  );
  await assert.rejects(
    multiselect(client, { ...bundle, codebookVersion: 'old' }, { userId: 'js-bob', history: HISTORY, epsilon: 1, k: 2 }),
    (err) => err.code === 3 && /codebook_version 'old' is not this server's/.test(err.details),
  );
  await assert.rejects(
    multiselect(client, bundle, { userId: 'js-bob', history: HISTORY, epsilon: 1, k: 2, signal: 'float' }),
    /signal must be 'code' or 'lattice'/,
  );
});

test('the lattice signal is served too', async () => {
  const r = await multiselect(client, bundle, { history: HISTORY, epsilon: 1, k: 2, signal: 'lattice' });
  assert.equal(new Set(r.itemIds).size, 2);
});

test('a tampered bundle is refused, naming the file', () => {
  const copy = join(toy.dir, 'tampered');
  cpSync(toy.bundle, copy, { recursive: true });
  const npy = readFileSync(join(copy, 'embedding.npy'));
  npy[npy.length - 1] ^= 1;
  writeFileSync(join(copy, 'embedding.npy'), npy);
  assert.throws(() => loadBundle(copy), /embedding\.npy has sha256 [0-9a-f]+ but manifest\.json says/);
  const manifest = JSON.parse(readFileSync(join(toy.bundle, 'manifest.json'), 'utf8'));
  cpSync(join(toy.bundle, 'embedding.npy'), join(copy, 'embedding.npy'));
  writeFileSync(join(copy, 'manifest.json'), JSON.stringify({ ...manifest, radius: manifest.radius * 2 }));
  assert.throws(() => loadBundle(copy), /grid_step [0-9.e-]+ and lattice_radius \d+; expected/);
  const regridded = { ...manifest, radius: manifest.radius * 2, grid_step: manifest.grid_step * 2 };
  writeFileSync(join(copy, 'manifest.json'), JSON.stringify(regridded));
  assert.throws(() => loadBundle(copy), /not the manifest's embedding_version/);
  writeFileSync(join(copy, 'manifest.json'), JSON.stringify({ ...manifest, format_version: 1 }));
  assert.throws(() => loadBundle(copy), /format_version 1 \(a float signal\)/);
  writeFileSync(join(copy, 'manifest.json'), JSON.stringify({ ...manifest, format_version: 2 }));
  assert.throws(() => loadBundle(copy), /format_version 2 \(the lattice signal without the codebook\)/);
  writeFileSync(join(copy, 'manifest.json'), JSON.stringify({ ...manifest, codebook_version: '0'.repeat(64) }));
  assert.throws(() => loadBundle(copy), /codebook\.json hashes to [0-9a-f]+, not the manifest's codebook_version/);
});
