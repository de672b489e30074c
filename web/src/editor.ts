import { EditorView, minimalSetup } from 'codemirror';
import { highlightActiveLine, keymap, lineNumbers } from '@codemirror/view';
import { Extension } from '@codemirror/state';
import { bracketMatching, indentOnInput, StreamLanguage } from '@codemirror/language';
import { python } from '@codemirror/lang-python';
import { javascript } from '@codemirror/lang-javascript';
import { shell } from '@codemirror/legacy-modes/mode/shell';

// The UI's one code editor setup (CodeMirror 6): the playground's cells
// and the file browser's editor.
export const editorSetup: Extension = [minimalSetup, lineNumbers(), highlightActiveLine(), bracketMatching(), indentOnInput()];

// mode is the highlighting of a run_code language.
export function mode(lang: string): Extension {
  switch (lang) {
    case 'python':
      return python();
    case 'js':
    case 'javascript':
      return javascript();
    case 'ts':
    case 'typescript':
      return javascript({ typescript: true });
    case 'sh':
    case 'bash':
    case 'shell':
      return StreamLanguage.define(shell);
  }
  return [];
}

const EXT: Record<string, string> = { py: 'python', js: 'js', mjs: 'js', cjs: 'js', jsx: 'js', ts: 'ts', tsx: 'ts', sh: 'sh', bash: 'sh' };

// modeForPath is the highlighting of a file, told from its name.
export function modeForPath(path: string): Extension {
  const m = /\.([A-Za-z0-9]+)$/.exec(path);
  return mode(m ? (EXT[m[1].toLowerCase()] ?? '') : '');
}

export { EditorView, keymap };
