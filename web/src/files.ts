import { api, APIError, fetchRaw, FileContent, FileEntry } from './api';
import { clear, fill, h, Keyed, keyed } from './dom';
import { htmlFrame } from './artifacts';
import { Page } from './page';
import { EditorView, editorSetup, keymap, modeForPath } from './editor';

// The workspace browser of one session: a tree (lazy, a directory's
// entries when it opens), each entry's size and modified time; a preview of
// a file (text, editable and saved through write_file, which writes
// atomically; an image; HTML in the sandboxed frame); upload (a file
// input or drag and drop, streamed by PUT .../upload/, which replaces a
// file only once the whole body is in); download of a file, or of a folder
// as a .tar.gz (GET .../download/). Paths are shown as /home/user/…; the
// server speaks workspace-relative paths.

const HOME = '/home/user';
const PREVIEW_MAX = 2 << 20; // a bigger file is offered for download, not shown

export function shown(rel: string): string {
  return rel === '' || rel === '.' ? HOME : `${HOME}/${rel}`;
}

function human(n: number): string {
  if (n < 1024) return `${n} B`;
  const u = ['KiB', 'MiB', 'GiB', 'TiB'];
  let i = -1;
  do {
    n /= 1024;
    i++;
  } while (n >= 1024 && i < u.length - 1);
  return `${n.toFixed(n < 10 ? 1 : 0)} ${u[i]}`;
}

function enc(rel: string): string {
  return rel.split('/').map(encodeURIComponent).join('/');
}

// saveBlob hands bytes to the browser as a download.
function saveBlob(b: Blob, name: string) {
  const url = URL.createObjectURL(b);
  const a = h('a', { href: url, download: name, hidden: true });
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(url), 60_000);
}

export async function download(session: string, rel: string, dir: boolean) {
  const r = await fetchRaw('GET', `/v1/sessions/${encodeURIComponent(session)}/download/${enc(rel)}${dir ? '/' : ''}`);
  const base = rel.split('/').pop() || 'user';
  saveBlob(await r.blob(), dir ? `${base}.tar.gz` : base);
}

// mountFiles fills el with the browser of session, opening at rel (a
// file is previewed, a directory listed). It returns a close function.
export function mountFiles(el: HTMLElement, session: string, rel = ''): () => void {
  const sp = `/v1/sessions/${encodeURIComponent(session)}`;
  const status = h('p', { id: 'files-status', class: 'hint', 'aria-live': 'polite' });
  const tree = h('div', { id: 'files-tree', class: 'files-tree mono' });
  const preview = h('div', { id: 'files-preview', class: 'files-preview' });
  const picker = h('input', { type: 'file', id: 'files-upload', multiple: true, 'aria-label': 'upload files' });
  let uploadDir = '';
  const where = h('span', { id: 'files-upload-dir', class: 'mono' }, shown(''));
  let closed = false;
  let editor: EditorView | null = null;

  function say(text: string, cls = 'hint') {
    status.textContent = text;
    status.className = cls;
  }
  function fail(e: unknown) {
    say(e instanceof APIError ? `${e.code}: ${e.message}` : String(e), 'error');
  }

  // Each listed directory's entries are kept by path across refreshes
  // (after an upload, a save or Refresh): a kept entry keeps its nodes,
  // so an opened folder stays open (and is listed again), and a click or
  // the focus on an entry lives through the refresh.
  interface Row {
    el: HTMLElement;
    e: FileEntry;
    name: HTMLButtonElement;
    size: HTMLElement;
    mtime: HTMLElement;
    kids: HTMLElement;
  }
  const lists = new WeakMap<HTMLElement, Keyed<FileEntry, Row>>();
  const isDir = (e: FileEntry) => e.type === 'dir' || (e.type === 'symlink' && e.target_type === 'dir');

  async function listDir(dir: string, into: HTMLElement) {
    const path = dir ? `${sp}/files/${enc(dir)}/` : `${sp}/files/`;
    const l = await api<{ entries: FileEntry[] | null; truncated: boolean }>('GET', path);
    let rows = lists.get(into);
    if (!rows) {
      // A directory and a file of one name are two entries.
      rows = keyed(into, (e: FileEntry) => `${isDir(e) ? 'd' : 'f'}${e.path}`, entryRow, drawEntry);
      lists.set(into, rows);
    }
    rows.sync(l.entries ?? [], l.truncated && h('div', { class: 'hint' }, 'more entries not shown'), !l.entries?.length && h('div', { class: 'hint' }, '(empty)'));
    await Promise.all(Array.from(rows.entries.values(), (r) => (r.kids.hidden ? null : listDir(r.e.path, r.kids))));
  }

  function entryRow(e: FileEntry): Row {
    const dir = isDir(e);
    const kids = h('div', { class: 'files-kids', hidden: true });
    const name = h('button', { type: 'button', class: `files-name ${dir ? 'dir' : 'file'}`, 'data-path': e.path, title: shown(e.path) });
    const dl = h('button', { type: 'button', class: 'files-dl', title: dir ? 'download as .tar.gz' : 'download', 'aria-label': `download ${e.name}` }, '⤓');
    dl.addEventListener('click', () => download(session, e.path, dir).catch(fail));
    name.addEventListener('click', () => {
      if (!dir) {
        open(e.path).catch(fail);
        return;
      }
      uploadDir = e.path;
      where.textContent = shown(e.path);
      if (kids.hidden) {
        kids.hidden = false;
        name.firstChild!.textContent = '▾ ';
        listDir(e.path, kids).catch(fail);
      } else {
        kids.hidden = true;
        name.firstChild!.textContent = '▸ ';
      }
    });
    const size = h('span', { class: 'files-size' });
    const mtime = h('span', { class: 'files-mtime' });
    const row = h('div', { class: 'files-row', 'data-type': e.type }, name, size, mtime, dl);
    return { el: h('div', { class: 'files-entry' }, row, kids), e, name, size, mtime, kids };
  }

  function drawEntry(r: Row, e: FileEntry) {
    r.e = e;
    const dir = isDir(e);
    const row = r.name.parentElement!;
    if (row.dataset.type !== e.type) row.dataset.type = e.type;
    // The name's first text is the folder's open mark, which a click sets.
    const mark = dir ? (r.kids.hidden ? '▸ ' : '▾ ') : '';
    fill(r.name, null, mark, e.name, e.type === 'symlink' ? ` → ${e.target ?? ''}` : '');
    fill(r.size, null, dir ? '' : human(e.size));
    fill(r.mtime, { title: e.mtime }, new Date(e.mtime).toLocaleString());
  }

  async function open(path: string) {
    clear(preview);
    say(`opening ${shown(path)}…`);
    const st = await api<{ entry: FileEntry }>('POST', '/v1/stat_file', { session, path });
    const head = h('div', { class: 'row' }, h('strong', { class: 'mono', id: 'files-open' }, shown(path)), h('span', { class: 'hint' }, human(st.entry.size)));
    const dl = h('button', { type: 'button', id: 'files-download' }, 'Download');
    dl.addEventListener('click', () => download(session, path, false).catch(fail));
    head.append(dl);
    preview.append(head);
    if (st.entry.size > PREVIEW_MAX) {
      preview.append(h('p', { class: 'hint' }, 'too big to preview here: download it'));
      say('');
      return;
    }
    const c = await api<FileContent>('GET', `${sp}/files/${enc(path)}`);
    if (c.media_type?.startsWith('image/')) {
      const src = c.encoding === 'base64' ? `data:${c.media_type};base64,${c.content}` : `data:${c.media_type};charset=utf-8,${encodeURIComponent(c.content)}`;
      preview.append(h('img', { class: 'artifact-img', id: 'files-image', alt: path, src }));
    } else if (c.encoding === 'base64') {
      preview.append(h('p', { class: 'hint' }, 'binary file: download it'));
    } else {
      if (/\.html?$/i.test(path)) {
        const frame = htmlFrame(c.content);
        frame.id = 'files-html';
        preview.append(frame);
      }
      const text = h('div', { id: 'files-text', class: 'editor files-text' });
      const save = h('button', { type: 'button', id: 'files-save', class: 'primary', disabled: true, title: 'Ctrl+S' }, 'Save');
      const doSave = async () => {
        save.disabled = true;
        try {
          await fetchRaw('PUT', `${sp}/files/${enc(path)}`, new Blob([view.state.doc.toString()]));
          say(`saved ${shown(path)}`, 'ok');
          refresh();
        } catch (e) {
          save.disabled = false;
          fail(e);
        }
      };
      editor?.destroy();
      const view = new EditorView({
        doc: c.content,
        parent: text,
        extensions: [
          keymap.of([{ key: 'Mod-s', preventDefault: true, run: () => (save.disabled || doSave(), true) }]),
          editorSetup,
          modeForPath(path),
          EditorView.updateListener.of((u) => {
            if (u.docChanged) save.disabled = false;
          }),
          EditorView.contentAttributes.of({ 'aria-label': 'file content' }),
        ],
      });
      editor = view;
      save.addEventListener('click', doSave);
      head.append(save);
      preview.append(text);
    }
    say('');
  }

  async function upload(files: FileList | File[]) {
    for (const f of Array.from(files)) {
      const rel = uploadDir ? `${uploadDir}/${f.name}` : f.name;
      say(`uploading ${shown(rel)} (${human(f.size)})…`, 'wait');
      try {
        await fetchRaw('PUT', `${sp}/upload/${enc(rel)}`, f);
        say(`uploaded ${shown(rel)}`, 'ok');
      } catch (e) {
        fail(e);
        return;
      }
    }
    refresh();
  }

  function refresh() {
    if (!closed) listDir('', tree).catch(fail);
  }

  picker.addEventListener('change', () => {
    if (picker.files?.length) upload(picker.files).finally(() => (picker.value = ''));
  });
  const drop = h('div', { id: 'files-drop', class: 'files-drop' }, 'Drop files here to upload into ', where, ' — or ', picker);
  drop.addEventListener('dragover', (ev) => {
    ev.preventDefault();
    drop.classList.add('over');
  });
  drop.addEventListener('dragleave', () => drop.classList.remove('over'));
  drop.addEventListener('drop', (ev) => {
    ev.preventDefault();
    drop.classList.remove('over');
    if (ev.dataTransfer?.files.length) upload(ev.dataTransfer.files);
  });
  const all = h('button', { type: 'button', id: 'files-download-all' }, 'Download all (.tar.gz)');
  all.addEventListener('click', () => download(session, '', true).catch(fail));
  const reload = h('button', { type: 'button', id: 'files-refresh' }, 'Refresh');
  reload.addEventListener('click', refresh);

  el.append(
    h('div', { class: 'row' }, reload, all),
    drop,
    status,
    h('div', { class: 'files-panes' }, tree, preview),
  );
  refresh();
  if (rel && !rel.endsWith('/')) open(rel).catch(fail);
  return () => {
    closed = true;
    editor?.destroy();
  };
}

// filesPage is #/files/<session>[/<path>].
export function filesPage(session: string, rel = ''): Page {
  const el = h('section', { id: 'files' }, h('h1', null, 'Files ', h('span', { class: 'badge' }, session)));
  const close = mountFiles(el, session, rel);
  return { el, close };
}
