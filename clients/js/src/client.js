// MultiSelect over gRPC with @grpc/grpc-js, loading the repository's proto at run time.

import { randomUUID } from 'node:crypto';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

import grpc from '@grpc/grpc-js';
import protoLoader from '@grpc/proto-loader';

import { localChoice, scores, signal } from './device.js';

export const PROTO = join(dirname(fileURLToPath(import.meta.url)), '..', '..', '..', 'proto', 'recsvc', 'v1', 'selection.proto');

let service = null;

function serviceClass() {
  if (service === null) {
    const definition = protoLoader.loadSync(PROTO, { keepCase: true, longs: String, defaults: true, oneofs: true });
    service = grpc.loadPackageDefinition(definition).recsvc.v1.PrivateSelection;
  }
  return service;
}

// A PrivateSelection client (plaintext unless `credentials` are given).
export function connect(target, credentials = grpc.credentials.createInsecure()) {
  const Client = serviceClass();
  return new Client(target, credentials);
}

function call(client, method, request, metadata, deadlineMs) {
  return new Promise((resolve, reject) => {
    client[method](request, metadata, { deadline: Date.now() + deadlineMs }, (err, answer) => (err ? reject(err) : resolve(answer)));
  });
}

// Multi-selection: sends the signal of `history`, receives k items and keeps the best locally.
// Resolves to { itemId, itemIds, epsilonSpent, budgetRemaining, charged, replayed, requestId };
// the server never learns itemId. A refusal rejects with a grpc error (err.code, err.details).
export async function multiselect(client, bundle, { userId = '', history, epsilon, k, requestId = randomUUID(), token = null, deadlineMs = 30000, randomWords }) {
  const metadata = new grpc.Metadata();
  if (token) metadata.add('authorization', `Bearer ${token}`);
  const hist = Array.from(history, String);
  const request = {
    user_id: userId,
    request_id: requestId,
    signal: Array.from(signal(bundle, hist, epsilon, randomWords)),
    embedding_version: bundle.version,
    k,
    epsilon,
  };
  const answer = await call(client, 'MultiSelect', request, metadata, deadlineMs);
  const itemIds = answer.item_ids;
  return {
    itemId: itemIds[localChoice(scores(bundle, hist, itemIds))],
    itemIds,
    epsilonSpent: answer.epsilon_spent,
    budgetRemaining: answer.budget_remaining,
    charged: answer.charged,
    replayed: answer.replayed,
    requestId: answer.request_id || requestId,
  };
}
