// Images in the chat window, on a vision model of its own server (the default GGUF beside a
// random-weight projector, on llama.cpp: 16 tokens an image): attach by picking a file, by
// pasting and by dropping; thumbnails before sending (one removed); the request carries them
// as image_url parts; the reply's usage says what the images cost; the store keeps them, so a
// reload shows them, and a click enlarges one. On the suite's own server (a model without a
// projector) the attach button is off, with the reason said.
import assert from 'node:assert/strict';
import { mkdtempSync, readFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, test } from 'node:test';
import { launch, lastReply, newChat, openPage, screenshot, startServer, stopServer, storedConversation, usePage, waitFinish, currentServerId } from './helpers.js';

const VISION = process.env.SHOAL_TEST_VISION_GGUF;
const IMAGE_TOKENS = 16;

let browser;
let server;

before(async () => {
  assert.ok(VISION, 'SHOAL_TEST_VISION_GGUF is not set (make models; the Makefile exports it)');
  browser = await launch();
  const dir = mkdtempSync(join(tmpdir(), 'shoal-ui-images-'));
  server = await startServer(['--model', VISION, '--backend', 'llama', '--db', join(dir, 'store.sqlite')], { prefixCacheMb: 64 });
});

after(async () => {
  if (server) await stopServer(server.proc);
  await browser?.close();
});

/** A PNG of `w`×`h` in one colour, made by the page's own canvas; base64 without the data: prefix. */
async function pngIn(page, w, h, colour) {
  return page.evaluate(
    ([w, h, colour]) => {
      const c = document.createElement('canvas');
      c.width = w;
      c.height = h;
      const ctx = c.getContext('2d');
      ctx.fillStyle = colour;
      ctx.fillRect(0, 0, w, h);
      ctx.fillStyle = '#fff';
      ctx.fillRect(0, 0, w / 2, h / 3);
      return c.toDataURL('image/png').split(',')[1];
    },
    [w, h, colour],
  );
}

/**
 * Hands a PNG to `target` as the browser would: a clipboard `paste` on the text box, or a
 * `drop` on the composer.
 */
async function deliver(target, kind, b64, name) {
  await target.evaluate(
    (el, [kind, b64, name]) => {
      const bytes = Uint8Array.from(atob(b64), (c) => c.charCodeAt(0));
      const dt = new DataTransfer();
      dt.items.add(new File([bytes], name, { type: 'image/png' }));
      const init = { bubbles: true, cancelable: true };
      el.dispatchEvent(kind === 'paste' ? new ClipboardEvent('paste', { ...init, clipboardData: dt }) : new DragEvent('drop', { ...init, dataTransfer: dt }));
    },
    [kind, b64, name],
  );
}

for (const width of [1280, 420]) {
  test(`images attached by picking, pasting and dropping reach a vision model and are kept (${width} px)`, async () => {
    await usePage(await openPage(browser, { base: server.url, width }), `images-${width}`, async (page) => {
      await newChat(page, { maxTokens: '8' });
      await page.getByTestId('attach-button').waitFor();
      assert.equal(await page.getByTestId('attach-button').isDisabled(), false);
      const red = await pngIn(page, 80, 60, '#c00');
      const green = await pngIn(page, 40, 90, '#0a0');
      const blue = await pngIn(page, 50, 50, '#00c');
      // Picked from a file dialog.
      await page.getByTestId('image-input').setInputFiles({ name: 'red.png', mimeType: 'image/png', buffer: Buffer.from(red, 'base64') });
      await deliver(page.getByTestId('composer-input'), 'paste', green, 'green.png');
      await deliver(page.locator('form.composer'), 'drop', blue, 'blue.png');
      const thumbs = page.getByTestId('attached-images').locator('img');
      await thumbs.nth(2).waitFor();
      assert.equal(await thumbs.count(), 3);
      // Taken back before sending.
      await page.getByTestId('remove-image').nth(1).click();
      assert.equal(await thumbs.count(), 2);
      await page.getByTestId('composer-input').fill('What do these show?');
      const sent = page.waitForRequest((r) => r.url().endsWith('/v1/chat/completions') && r.method() === 'POST');
      await page.getByTestId('composer-input').press('Enter');
      const body = JSON.parse((await sent).postData());
      const user = body.messages.findLast((m) => m.role === 'user');
      const kinds = user.content.map((p) => p.type);
      assert.deepEqual(kinds, ['image_url', 'image_url', 'text'], JSON.stringify(kinds));
      assert.equal(user.content[0].image_url.url, `data:image/png;base64,${red}`);
      assert.equal(user.content[1].image_url.url, `data:image/png;base64,${blue}`);
      assert.equal(await page.getByTestId('attached-images').count(), 0, 'the composer is empty again');
      await waitFinish(page);
      // The usage says what the two images cost.
      const reply = lastReply(page);
      await reply.getByTestId('usage-summary').waitFor();
      assert.match(await reply.getByTestId('usage-summary').innerText(), new RegExp(`${2 * IMAGE_TOKENS} image tok`));
      await reply.getByTestId('usage-summary').click();
      assert.equal(await reply.getByTestId('usage-image').getAttribute('data-value'), String(2 * IMAGE_TOKENS));
      // The message shows them; a click enlarges one, another closes it.
      const shown = page.getByTestId('message-user').last().getByTestId('image-thumb');
      assert.equal(await shown.count(), 2);
      await shown.first().click();
      await page.getByTestId('image-lightbox').waitFor();
      await screenshot(page, `images-enlarged-${width}`);
      await page.keyboard.press('Escape');
      await page.getByTestId('image-lightbox').waitFor({ state: 'detached' });
      // The store keeps them, and a reload shows them again.
      const id = await currentServerId(page);
      const stored = await storedConversation(id, server.url);
      const images = stored.messages[0].pieces[0].metadata.images;
      assert.equal(images.length, 2);
      assert.equal(images[0].data, red);
      await page.reload();
      await page.getByTestId('message-user').last().getByTestId('image-thumb').nth(1).waitFor();
      // An exported chat carries them whole, and what they cost.
      await page.getByTestId('export-menu').locator('summary').click();
      const [json] = await Promise.all([page.waitForEvent('download'), page.getByTestId('export-json').click()]);
      const doc = JSON.parse(readFileSync(await json.path(), 'utf8'));
      assert.deepEqual(
        doc.messages[0].images.map((i) => [i.media_type, i.name, i.data]),
        [['image/png', 'red.png', red], ['image/png', 'blue.png', blue]],
      );
      assert.equal(doc.messages[1].usage.image_tokens, 2 * IMAGE_TOKENS);
      await page.getByTestId('export-menu').locator('summary').click();
      const [md] = await Promise.all([page.waitForEvent('download'), page.getByTestId('export-markdown').click()]);
      const text = readFileSync(await md.path(), 'utf8');
      assert.ok(text.includes(`![red.png](data:image/png;base64,${red})`), 'the Markdown shows the images inline');
      assert.ok(text.includes(`cached, ${2 * IMAGE_TOKENS} image)`), text.slice(-400));
    });
  });
}

test('a model without a projector keeps the attach button off and says why', async () => {
  await usePage(await openPage(browser), 'images-no-vision', async (page) => {
    await newChat(page);
    const attach = page.getByTestId('attach-button');
    await attach.waitFor();
    await page.waitForFunction(() => document.querySelector('[data-testid=attach-button]')?.disabled);
    assert.match(await attach.getAttribute('title'), /cannot read images/);
  });
});
