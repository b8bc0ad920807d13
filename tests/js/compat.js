#!/usr/bin/env node
// amqplib against a broker: `node compat.js SCENARIO URL`. Prints one JSON line with what the
// client saw and exits 0, or prints the error and exits 1. Run by tests/test_client_amqplib.py.
'use strict';
const amqp = require('amqplib');
const callbackApi = require('amqplib/callback_api');

const [scenario, url] = process.argv.slice(2);
const name = (prefix) => `${prefix}.js.${process.pid}.${Math.random().toString(16).slice(2, 10)}`;

function done(result) {
  console.log(JSON.stringify(result));
  process.exit(0);
}

function fail(err) {
  console.error(err && err.stack ? err.stack : String(err));
  process.exit(1);
}

function nextMessage(ch, queue) {
  return new Promise((resolve, reject) => {
    ch.consume(queue, (msg) => resolve(msg), { noAck: true }).catch(reject);
  });
}

const scenarios = {
  async roundtrip() {
    const conn = await amqp.connect(url);
    const ch = await conn.createChannel();
    const q = (await ch.assertQueue('', { exclusive: true })).queue;
    ch.sendToQueue(q, Buffer.from('hello'), { contentType: 'text/plain', headers: { n: 1 } });
    const msg = await nextMessage(ch, q);
    await conn.close();
    return { body: msg.content.toString(), contentType: msg.properties.contentType, n: msg.properties.headers.n };
  },

  async confirms() {
    const conn = await amqp.connect(url);
    const ch = await conn.createConfirmChannel();
    const q = (await ch.assertQueue('', { exclusive: true })).queue;
    for (let i = 0; i < 50; i++) ch.sendToQueue(q, Buffer.from(String(i)));
    await ch.waitForConfirms();
    const count = (await ch.checkQueue(q)).messageCount;
    await conn.close();
    return { count };
  },

  async cancel_notify() {
    // the queue is deleted from another connection: the consumer callback gets null
    const conn = await amqp.connect(url);
    const ch = await conn.createChannel();
    const q = name('cancel');
    await ch.assertQueue(q, { autoDelete: false });
    const cancelled = new Promise((resolve) => ch.consume(q, (msg) => { if (msg === null) resolve(true); }));
    const other = await amqp.connect(url);
    await (await other.createChannel()).deleteQueue(q);
    await other.close();
    const result = await cancelled;
    await conn.close();
    return { cancelled: result };
  },

  async refused_login() {
    const bad = url.replace('guest:guest@', 'guest:wrong@');
    try {
      const conn = await amqp.connect(bad);
      await conn.close();
      return { refused: false };
    } catch (err) {
      return { refused: true, message: String(err.message) };
    }
  },

  async large() {
    const conn = await amqp.connect(url);
    const ch = await conn.createConfirmChannel();
    const q = (await ch.assertQueue('', { exclusive: true })).queue;
    const body = Buffer.alloc(3 * 131072 + 17, 'L');
    ch.sendToQueue(q, body);
    await ch.waitForConfirms();
    const msg = await nextMessage(ch, q);
    await conn.close();
    return { size: msg.content.length, same: msg.content.equals(body) };
  },

  async queue_deleted_under_consumer() {
    // delete the queue the same channel consumes from: delete-ok must come before the cancel,
    // or amqplib fails deleteQueue with "Channel ended, no reply will be forthcoming"
    const conn = await amqp.connect(url);
    const ch = await conn.createChannel();
    const q = name('delown');
    await ch.assertQueue(q, { autoDelete: false });
    let onCancel;
    const cancelled = new Promise((resolve) => { onCancel = resolve; });
    await ch.consume(q, (msg) => { if (msg === null) onCancel(true); });
    const ok = await ch.deleteQueue(q);
    const result = await cancelled;
    await ch.assertQueue('', { exclusive: true });   // the channel is still usable
    await conn.close();
    return { messageCount: ok.messageCount, cancelled: result };
  },

  flood_close() {
    // callback API: publish until the socket buffer is full, then close at once
    return new Promise((resolve, reject) => {
      callbackApi.connect(url, (err, conn) => {
        if (err) return reject(err);
        conn.on('error', reject);
        conn.createChannel((err, ch) => {
          if (err) return reject(err);
          const q = name('flood');
          ch.assertQueue(q, { exclusive: true }, (err) => {
            if (err) return reject(err);
            let sent = 1;
            const body = Buffer.alloc(1000, 'f');
            while (ch.sendToQueue(q, body)) sent++;
            conn.close((err) => (err ? reject(err) : resolve({ sent, closed: true })));
          });
        });
      });
    });
  },
};

if (!scenarios[scenario]) fail(new Error(`unknown scenario ${scenario}`));
Promise.resolve().then(() => scenarios[scenario]()).then(done, fail);
setTimeout(() => fail(new Error(`${scenario}: no result within 30 s`)), 30000).unref();
