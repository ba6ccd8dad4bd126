import { defineConfig } from 'vite';
import solid from 'vite-plugin-solid';

// `npm run dev` / `npm run preview` proxy the API to a running `shoal serve`
// (SHOAL_URL, default http://127.0.0.1:8421), so the UI keeps using
// same-origin relative URLs exactly as when the binary serves it at `/`.
const target = process.env.SHOAL_URL || 'http://127.0.0.1:8421';
const proxy = { '/v1': { target, changeOrigin: true }, '/health': { target, changeOrigin: true } };

export default defineConfig({
  plugins: [solid()],
  server: { proxy },
  preview: { proxy },
  build: {
    target: 'es2022',
    outDir: 'dist',
    emptyOutDir: true,
    assetsDir: 'assets',
    sourcemap: false,
  },
});
