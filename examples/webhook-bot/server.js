'use strict';
// A webhook receiver that handles each delivery once. Senders (GitHub,
// Stripe, Shopify) deliver at least once: a timeout or a 5xx makes them
// send the same delivery again, sometimes while the first is still being
// handled. The delivery's id is the idempotency key; its payload is the
// request, so a different payload under a reused id is refused.
//
//   IDEM_STORE=redis://127.0.0.1:6379 node server.js
//   curl -H 'X-Delivery-Id: d-1' -d '{"action":"opened","number":7}' localhost:3000/webhooks
const http = require('node:http');
const { openStore, makeIdempotent, MismatchError } = require('../../idem-node');

const store = openStore(process.env.IDEM_STORE || 'sqlite:webhook-bot.db');
const handled = [];

// The bot's side effect: here, a line in a list; in a real bot, a chat
// message or a ticket. A duplicate delivery waits for the first one's
// outcome (up to 30 s) instead of running it again.
const handle = makeIdempotent(
  async (deliveryId, event) => {
    handled.push(`${deliveryId}: ${event.action} #${event.number}`);
    return { posted: handled.length };
  },
  { store, key: 0, body: 1, namespace: 'webhook-bot', wait: 30, lease: 30 },
);

function read(request) {
  return new Promise((resolve, reject) => {
    const chunks = [];
    request.on('data', (chunk) => chunks.push(chunk));
    request.on('end', () => resolve(Buffer.concat(chunks).toString('utf8')));
    request.on('error', reject);
  });
}

const server = http.createServer(async (request, response) => {
  if (request.method !== 'POST' || request.url !== '/webhooks') {
    response.writeHead(404).end();
    return;
  }
  const id = request.headers['x-delivery-id'];
  if (typeof id !== 'string') {
    response.writeHead(400).end('no X-Delivery-Id');
    return;
  }
  let event;
  try {
    event = JSON.parse(await read(request));
  } catch {
    response.writeHead(400).end('not JSON');
    return;
  }
  try {
    const outcome = await handle(id, event);
    response.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify(outcome));
  } catch (error) {
    // A reused id with another payload is the sender's bug: retrying will
    // not help. Anything else (a store down, a handler that threw) is
    // answered 500, and the sender delivers again later.
    const status = error instanceof MismatchError ? 422 : 500;
    response.writeHead(status).end(error.message);
  }
});

server.listen(Number(process.env.PORT || 3000), '127.0.0.1', () => {
  console.log(`webhook bot on http://127.0.0.1:${server.address().port}/webhooks`);
});
module.exports = { server, handled };
