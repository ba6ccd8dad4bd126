// Markdown to safe HTML: marked renders, highlight.js colours code blocks,
// DOMPurify removes anything active.
import DOMPurify from 'dompurify';
import hljs from 'highlight.js/lib/common';
import { Marked } from 'marked';
import { markedHighlight } from 'marked-highlight';

/**
 * A renderer whose code fences are coloured: as the language a fence names
 * when highlight.js knows it, else (with `guess`) as the language its text
 * reads as. Guessing tries every language, so a reply still streaming is not
 * guessed at on each token.
 */
function renderer(guess: boolean): Marked {
  return new Marked(
    markedHighlight({
      emptyLangClass: 'hljs',
      langPrefix: 'hljs language-',
      highlight(code, lang) {
        if (lang && hljs.getLanguage(lang)) return hljs.highlight(code, { language: lang }).value;
        // Returned as it came, the code is escaped by marked.
        return guess ? hljs.highlightAuto(code).value : code;
      },
    }),
    { gfm: true, breaks: true, async: false },
  );
}

const settled = renderer(true);
const streaming = renderer(false);

DOMPurify.addHook('afterSanitizeAttributes', (node) => {
  if (node.tagName === 'A') {
    node.setAttribute('target', '_blank');
    node.setAttribute('rel', 'noopener noreferrer');
  }
});

export function renderMarkdown(src: string, { live = false } = {}): string {
  const html = (live ? streaming : settled).parse(src) as string;
  return DOMPurify.sanitize(html, {
    FORBID_TAGS: ['style', 'form', 'input', 'button', 'iframe', 'img'],
    FORBID_ATTR: ['style'],
  });
}
