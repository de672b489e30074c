import { h } from './dom';

// A page is an element and what to stop when the user leaves it.
export interface Page {
  el: HTMLElement;
  close?: () => void;
}

let flashTimer: ReturnType<typeof setTimeout> | undefined;

// flash shows a short notice at the top of the page.
export function flash(text: string): void {
  let el = document.getElementById('flash');
  if (!el) {
    el = h('div', { id: 'flash', role: 'status' });
    document.body.append(el);
  }
  el.textContent = text;
  el.hidden = false;
  clearTimeout(flashTimer);
  flashTimer = setTimeout(() => {
    el.hidden = true;
  }, 3000);
}
