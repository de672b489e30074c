// The one way this UI builds DOM: h() creates elements and sets text with
// textContent, never innerHTML, so nothing a program prints (or a session
// name, a path, an audit entry) is ever parsed as HTML.

type Child = Node | string | number | null | undefined | false;
type Attrs = Record<string, string | number | boolean | EventListener | null | undefined>;

export function h<K extends keyof HTMLElementTagNameMap>(tag: K, attrs?: Attrs | null, ...children: (Child | Child[])[]): HTMLElementTagNameMap[K] {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs ?? {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k.startsWith('on') && typeof v === 'function') {
      el.addEventListener(k.slice(2), v);
    } else if (k === 'class') {
      el.className = String(v);
    } else if (v === true) {
      el.setAttribute(k, '');
    } else {
      el.setAttribute(k, String(v));
    }
  }
  append(el, ...children);
  return el;
}

export function append(el: Node, ...children: (Child | Child[])[]): void {
  for (const c of children) {
    if (c === null || c === undefined || c === false) continue;
    if (Array.isArray(c)) append(el, ...c);
    else el.appendChild(typeof c === 'object' ? c : document.createTextNode(String(c)));
  }
}

export function clear(el: Node): void {
  while (el.firstChild) el.removeChild(el.firstChild);
}

export function ago(iso: string): string {
  const t = Date.parse(iso);
  if (Number.isNaN(t)) return iso;
  const s = Math.round((Date.now() - t) / 1000);
  if (s < 60) return `${s}s ago`;
  if (s < 3600) return `${Math.round(s / 60)}m ago`;
  if (s < 86400) return `${Math.round(s / 3600)}h ago`;
  return new Date(t).toLocaleString();
}

// A list a page refreshes (on a timer, or when a filter or an upload
// changes it) is kept, not rebuilt: a rebuilt list replaces every node
// under a click, the focus, a text selection or a screen reader's place,
// and a click landing during the swap goes to a node that has left the
// page and is lost. keyed() keeps one entry per key in parent, in the
// order of the items of each refresh: a new key gets make()'s element, a
// gone key's element is removed, a kept key keeps its element (moved only
// when it is out of order: a move takes the focus from a button in it),
// and update() brings each entry up to date, best through fill(), which
// rewrites only what changed. Nodes that are no entry's (a placeholder
// such as "no processes", a "more not shown" line) are what sync's after
// says: they follow the entries and nothing else is left in parent.
export interface Entry {
  el: Element;
}

export interface Keyed<T, E extends Entry> {
  // sync shows items (entries of a repeated key after the first are
  // left out) followed by after.
  sync(items: readonly T[], ...after: (Node | null | undefined | false)[]): void;
  // entries are the shown entries by key.
  readonly entries: ReadonlyMap<string, E>;
}

export function keyed<T, E extends Entry>(parent: Element, key: (item: T) => string, make: (item: T) => E, update: (entry: E, item: T) => void): Keyed<T, E> {
  const entries = new Map<string, E>();
  return {
    entries,
    sync(items, ...after) {
      const want = new Map<string, T>();
      for (const it of items) {
        const k = key(it);
        if (!want.has(k)) want.set(k, it);
      }
      for (const [k, e] of entries) {
        if (!want.has(k)) {
          e.el.remove();
          entries.delete(k);
        }
      }
      // Whatever else is in parent goes first, so that the kept entries
      // are not moved around it.
      const els = new Set<Node>(Array.from(entries.values(), (e) => e.el));
      const tail = after.filter((n): n is Node => !!n);
      for (const n of Array.from(parent.childNodes)) if (!els.has(n) && !tail.includes(n)) n.remove();
      let at: ChildNode | null = parent.firstChild;
      for (const [k, it] of want) {
        let e = entries.get(k);
        if (!e) {
          e = make(it);
          entries.set(k, e);
        }
        update(e, it);
        if (e.el !== at) parent.insertBefore(e.el, at);
        else at = at.nextSibling;
      }
      for (const n of tail) {
        if (n !== at) parent.insertBefore(n, at);
        else at = at.nextSibling;
      }
    },
  };
}

// fill sets el's attributes and children, and touches the DOM only when
// what it is asked to draw differs from what it shows (the attributes and
// the children's markup it drew last are kept beside it), so that an
// unchanged element keeps its nodes and any text selected in them. The
// children are made anew on each call: they are only compared unless
// something changed.
const drawn = new WeakMap<Element, string>();

export function fill(el: HTMLElement, attrs: Record<string, string> | null, ...children: (Child | Child[])[]): void {
  const list = children.flat().filter((c): c is Node | string | number => c !== null && c !== undefined && c !== false);
  const k = JSON.stringify([attrs ?? {}, list.map((c) => (typeof c !== 'object' ? `t${c}` : c instanceof Element ? `e${c.outerHTML}` : `t${c.textContent}`))]);
  if (drawn.get(el) === k) return;
  drawn.set(el, k);
  for (const [a, v] of Object.entries(attrs ?? {})) {
    if (a === 'class') el.className = v;
    else el.setAttribute(a, v);
  }
  el.replaceChildren(...list.map((c) => (typeof c === 'object' ? c : String(c))));
}

// Refreshes overlap (a page's timer and an action's refresh, or a filter
// changed while a load was on its way), and their replies can come back
// in any order: drawn as they come, an older reply landing last would
// show, until the next refresh, a state that has passed ("paused" right
// after Resume). latest() numbers a page's refreshes in the order they
// are asked: each refresh takes a ticket when it starts, and asks the
// ticket before it draws a reply; the ticket says no when a refresh
// asked later has drawn already (and, saying yes, marks its own as the
// one drawn). A refresh drawn in steps (one request after another) asks
// before each step, so that no step of an older refresh lands over a
// newer one's.
export type Ticket = () => boolean;

export function latest(): () => Ticket {
  let asked = 0;
  let drawn = 0;
  return () => {
    const n = ++asked;
    return () => {
      if (n < drawn) return false;
      drawn = n;
      return true;
    };
  };
}
