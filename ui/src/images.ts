// Images the user attaches to a message: read from a file (picked, pasted or dropped),
// kept as they are when small, else scaled down in the browser so a chat stays a
// reasonable size in the store and in every later request that carries it.

import type { ImageAttachment } from './store';

/** What the server decodes (PNG, JPEG, WebP, GIF's first frame). */
export const IMAGE_TYPES = ['image/png', 'image/jpeg', 'image/webp', 'image/gif'];

/** Longest side kept; a vision model's preprocessing shrinks images far below this anyway. */
export const MAX_SIDE = 1536;
/** Bytes kept as sent; a larger file is re-encoded. */
export const MAX_BYTES = 2 * 1024 * 1024;

function base64(bytes: Uint8Array): string {
  let s = '';
  for (let i = 0; i < bytes.length; i += 0x8000) s += String.fromCharCode(...bytes.subarray(i, i + 0x8000));
  return btoa(s);
}

/** The file as an attachment, scaled down (as JPEG) when it is large. */
export async function attachImage(file: File): Promise<ImageAttachment> {
  if (!IMAGE_TYPES.includes(file.type)) {
    throw new Error(`${file.name || 'That file'} is not a PNG, JPEG, WebP or GIF image`);
  }
  const bitmap = await createImageBitmap(file).catch(() => {
    throw new Error(`${file.name || 'The image'} could not be read as an image`);
  });
  const { width, height } = bitmap;
  const name = file.name || undefined;
  if (width <= MAX_SIDE && height <= MAX_SIDE && file.size <= MAX_BYTES) {
    bitmap.close();
    return { mediaType: file.type, data: base64(new Uint8Array(await file.arrayBuffer())), name };
  }
  const scale = Math.min(1, MAX_SIDE / Math.max(width, height));
  const canvas = document.createElement('canvas');
  canvas.width = Math.max(1, Math.round(width * scale));
  canvas.height = Math.max(1, Math.round(height * scale));
  const ctx = canvas.getContext('2d');
  if (!ctx) throw new Error('this browser cannot scale images');
  ctx.drawImage(bitmap, 0, 0, canvas.width, canvas.height);
  bitmap.close();
  const url = canvas.toDataURL('image/jpeg', 0.9);
  return { mediaType: 'image/jpeg', data: url.slice(url.indexOf(',') + 1), name };
}
