#!/usr/bin/env node
// amqplib and a quorum queue across the loss of its leader: run by tests/test_quorum_clients.py.
//   node quorum_failover.js declare|load URL1 URL2 URL3 QUEUE DEAD LIMIT TOTAL KILL_AT
// declare: through URL1 (the leader-to-be), the queue with x-queue-type quorum, x-delivery-limit
// and its dead-letter queue. load: a consumer on URL3 (nacks the poison message with requeue, acks
// the rest) and a confirming publisher on URL2: the poison message first, until it is in the
// dead-letter queue, then TOTAL messages one by one, each sent again until confirmed; prints
// `kill` once KILL_AT are confirmed (the test kills URL1's node then), waits until the consumer
// has every confirmed one, and prints one JSON line of what was confirmed and seen.
'use strict';
const amqp = require('amqplib');

const [mode, url1, url2, url3, queue, dead, limit, total, killAt] = process.argv.slice(2);
const POISON = 'poison';
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

async function declare() {
  const conn = await amqp.connect(url1);
  const ch = await conn.createChannel();
  await ch.assertQueue(dead, { durable: true, arguments: { 'x-queue-type': 'quorum' } });
  await ch.assertQueue(queue, {
    durable: true,
    arguments: { 'x-queue-type': 'quorum', 'x-delivery-limit': Number(limit),
                 'x-dead-letter-exchange': '', 'x-dead-letter-routing-key': dead },
  });
  await conn.close();
  return {};
}

function publish(ch, body) {
  return new Promise((resolve) => {
    ch.sendToQueue(queue, Buffer.from(body), { persistent: true }, (err) => resolve(!err));
  });
}

async function load() {
  const seen = [];
  const consumerConn = await amqp.connect(url3);
  const consumerCh = await consumerConn.createChannel();
  let consumerClosed = false;
  consumerCh.on('close', () => { consumerClosed = true; });
  await consumerCh.prefetch(20);
  await consumerCh.consume(queue, (msg) => {
    const body = msg.content.toString();
    seen.push({ body, redelivered: msg.fields.redelivered, headers: msg.properties.headers || {} });
    if (body === POISON) consumerCh.nack(msg, false, true);
    else consumerCh.ack(msg);
  });

  const conn = await amqp.connect(url2);
  const ch = await conn.createConfirmChannel();
  while (!(await publish(ch, POISON)));
  for (;;) {       // until the poison message is in the dead-letter queue
    const probe = await conn.createChannel();
    const { messageCount } = await probe.checkQueue(dead);
    await probe.close();
    if (messageCount === 1) break;
    await sleep(50);
  }
  const confirmed = [];
  let killedAt = 0;
  let resumedAfterKill = -1;
  for (let i = 0; i < Number(total); i += 1) {
    const body = String(i);
    while (!(await publish(ch, body)));      // nacked: not confirmed, send it again
    confirmed.push(body);
    if (killedAt && resumedAfterKill < 0) resumedAfterKill = Date.now() - killedAt;
    if (confirmed.length === Number(killAt)) {
      console.log('kill');
      killedAt = Date.now();
    }
  }
  const want = new Set(confirmed);
  for (;;) {
    const have = new Set(seen.map((row) => row.body));
    if ([...want].every((body) => have.has(body))) break;
    if (consumerClosed) throw new Error('the consumer channel closed');
    await sleep(50);
  }
  await conn.close();
  await consumerConn.close();
  return { confirmed, seen, resumedAfterKill, consumerClosed };
}

setTimeout(() => { console.error('gave up after 200 s'); process.exit(2); }, 200000).unref();
(mode === 'declare' ? declare() : load()).then(
  (result) => { console.log(JSON.stringify(result)); process.exit(0); },
  (err) => { console.error(err && err.stack ? err.stack : String(err)); process.exit(1); });
