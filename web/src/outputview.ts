import { h } from './dom';

// OutputView is a program's output as a virtualised list of lines: every
// line is kept (as a string), only those in view (and a margin) are in the
// DOM, so 100k lines stay responsive. Lines do not wrap: each is one row
// of a fixed height, the scroll height is rows × height. Appends render on
// the next animation frame, at most once a frame; a view scrolled to the
// bottom follows the output.
export class OutputView {
  readonly el: HTMLDivElement;
  private readonly spacer: HTMLDivElement;
  private readonly rows: HTMLDivElement;
  private lines: string[] = [];
  private streams: number[] = []; // 0 stdout, 1 stderr, 2 note
  private partial: string | null = null;
  private partialStream = 0;
  private rowH = 0;
  private frame = 0;
  private follow = true;

  constructor(id?: string) {
    this.rows = h('div', { class: 'vrows' });
    this.spacer = h('div', { class: 'vspacer' }, this.rows);
    this.el = h('div', { id, class: 'output vout', 'aria-live': 'polite', role: 'log', tabindex: 0 }, this.spacer);
    this.el.addEventListener('scroll', () => {
      this.follow = this.el.scrollTop + this.el.clientHeight >= this.el.scrollHeight - 4;
      this.schedule();
    });
  }

  get lineCount(): number {
    return this.lines.length + (this.partial !== null ? 1 : 0);
  }

  clear(): void {
    this.lines = [];
    this.streams = [];
    this.partial = null;
    this.follow = true;
    this.schedule();
  }

  append(stream: string, data: string): void {
    const s = stream === 'stderr' ? 1 : stream === 'note' ? 2 : 0;
    const parts = data.split('\n');
    if (this.partial !== null) {
      parts[0] = this.partial + parts[0];
      this.partial = null;
    }
    const last = parts.pop()!;
    for (const p of parts) {
      this.lines.push(p);
      this.streams.push(s);
    }
    if (last !== '') {
      this.partial = last;
      this.partialStream = s;
    }
    this.schedule();
  }

  // settled resolves once what was appended so far is drawn.
  settled(): Promise<void> {
    return new Promise((resolve) => {
      this.schedule();
      requestAnimationFrame(() => resolve());
    });
  }

  private schedule(): void {
    if (!this.frame) this.frame = requestAnimationFrame(() => this.render());
  }

  private render(): void {
    this.frame = 0;
    if (!this.rowH) {
      const probe = h('div', { class: 'vrow' }, 'X');
      this.rows.append(probe);
      this.rowH = probe.getBoundingClientRect().height || 17;
      probe.remove();
    }
    const n = this.lineCount;
    this.spacer.style.height = `${n * this.rowH}px`;
    if (this.follow) this.el.scrollTop = this.el.scrollHeight;
    const first = Math.max(0, Math.floor(this.el.scrollTop / this.rowH) - 20);
    const last = Math.min(n, first + Math.ceil((this.el.clientHeight || 600) / this.rowH) + 40);
    const frag = document.createDocumentFragment();
    for (let i = first; i < last; i++) {
      const partial = i === this.lines.length;
      const s = partial ? this.partialStream : this.streams[i];
      frag.append(h('div', { class: s === 1 ? 'vrow stderr' : s === 2 ? 'vrow note' : 'vrow' }, visible(partial ? this.partial! : this.lines[i]), '\n'));
    }
    this.rows.replaceChildren(frag);
    this.rows.style.transform = `translateY(${first * this.rowH}px)`;
    this.el.dataset.lines = String(n);
  }
}

// Escape and other control characters in program output are shown as
// visible symbols: output is text here; only the terminal interprets them.
export function visible(s: string): string {
  return s.replace(/[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]/g, (c) => (c === '\x7f' ? '\u2421' : String.fromCharCode(0x2400 + c.charCodeAt(0))));
}
