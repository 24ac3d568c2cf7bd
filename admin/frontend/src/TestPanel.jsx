// "Testar": a chat beside the canvas that plays the patient against the saved draft or the published
// version (POST urls.rehearse, admin/views/followup/rehearse.py). The server replays the whole
// conversation from the start on each reply, in a transaction it rolls back: nothing is sent to
// anyone and nothing is kept. Under each reply, one line says what was understood and which exit the
// flow took ("Entendido: remarcar · Data=04/12/2026 → saída Completo"). Every word comes from
// boot.strings.rehearse (gettext on the server).
import { useCallback, useEffect, useRef, useState } from 'react';
import { RequestFailed, postJSON } from './api.js';
import './TestPanel.css';

const VERSIONS = ['draft', 'published'];

function fill(text, params) {
  return String(text).replace(/%\((\w+)\)s/g, (_m, key) => (params[key] !== undefined ? params[key] : ''));
}

function errorOf(error, fallback) {
  if (error instanceof RequestFailed && error.body && error.body.error) {
    const issues = (error.body.issues || []).map((issue) => issue.message).filter(Boolean);
    return [error.body.error, ...issues.slice(0, 3)].join(' ');
  }
  return fallback;
}

/** The line under a patient's reply: what was understood, then the exit taken. */
export function understoodLine(turn, s) {
  const parts = (turn.understood || []).join(' · ') || s.nothing_understood;
  let line = `${s.understood}: ${parts}`;
  if (turn.exit_label) line += ` → ${s.exit} ${turn.exit_label}`;
  if (turn.next_label) line += ` (${turn.next_label})`;
  return line;
}

function Footer({ transcript, s }) {
  if (!transcript) return null;
  let text;
  if (transcript.waiting) text = s.waiting;
  else if (transcript.status === 'completed') text = fill(s.ended, { resultado: transcript.outcome_label || '' });
  else if (transcript.status !== 'active') {
    text = fill(s.stopped, { motivo: transcript.reason_text || transcript.outcome_label || transcript.status });
  }
  return text ? <p className="lf-rehearse-state" role="status" data-status={transcript.status}>{text}</p> : null;
}

export function RehearsalPanel({ boot }) {
  const s = boot.strings.rehearse;
  const url = boot.urls.rehearse;
  const [open, setOpen] = useState(false);
  const [version, setVersion] = useState(boot.flow && boot.flow.active_version ? 'published' : 'draft');
  const [replies, setReplies] = useState([]);
  const [transcript, setTranscript] = useState(null);
  const [text, setText] = useState('');
  const [busy, setBusy] = useState(false);
  const [error, setError] = useState(null);
  const bottom = useRef(null);

  const play = useCallback(async (next, which) => {
    setBusy(true);
    setError(null);
    try {
      const data = await postJSON(url, { version: which, replies: next });
      setReplies(next);
      setTranscript(data);
      return true;
    } catch (failure) {
      setError(errorOf(failure, boot.strings.ui.error));
      return false;
    } finally {
      setBusy(false);
    }
  }, [url, boot]);

  const restart = useCallback((which) => {
    setTranscript(null);
    setText('');
    play([], which);
  }, [play]);

  useEffect(() => {
    if (open) restart(version);
  }, [open, version, restart]);

  useEffect(() => {
    if (bottom.current && bottom.current.scrollIntoView) bottom.current.scrollIntoView({ block: 'end' });
  }, [transcript, error]);

  const send = async (reply) => {
    if (busy) return;
    if (await play([...replies, reply], version) && reply !== null) setText('');
  };

  if (!open) {
    return (
      <button type="button" className="btn btn-sm btn-primary lf-rehearse-open" onClick={() => setOpen(true)}>
        {s.open}
      </button>
    );
  }
  const waiting = Boolean(transcript && transcript.waiting);
  return (
    <aside className="lf-rehearse" aria-label={s.title} aria-busy={busy}>
      <div className="lf-rehearse-head">
        <strong>{s.title}</strong>
        <div className="btn-group btn-group-sm" role="group">
          {VERSIONS.map((key) => (
            <button key={key} type="button" data-version={key} aria-pressed={version === key} disabled={busy}
                    className={`btn ${version === key ? 'btn-secondary' : 'btn-outline-secondary'}`}
                    onClick={() => setVersion(key)}>{s[key]}</button>
          ))}
        </div>
        <button type="button" className="close" aria-label={s.close} title={s.close}
                onClick={() => setOpen(false)}>×</button>
      </div>
      <p className="lf-help lf-rehearse-help">{s.help}</p>
      <div className="lf-rehearse-chat" aria-live="polite">
        {transcript && transcript.turns.map((turn, index) => (
          turn.role === 'bot' ? (
            <div key={index} className="lf-bubble lf-bubble-bot" data-node={turn.node || ''}>
              {turn.text === null ? <em>{s.unwritten}</em> : turn.text}
            </div>
          ) : (
            <div key={index} className="lf-turn-patient">
              <div className="lf-bubble lf-bubble-patient">{turn.text === null ? <em>{s.silent}</em> : turn.text}</div>
              <small className="lf-understood" title={turn.reason_text || ''} data-exit={turn.exit ? turn.exit.type : ''}>
                {understoodLine(turn, s)}
              </small>
            </div>
          )
        ))}
        {busy && <p className="lf-help">{s.running}</p>}
        <Footer transcript={transcript} s={s} />
        {error && <div className="alert alert-warning lf-rehearse-error" role="alert">{error}</div>}
        <div ref={bottom} />
      </div>
      <form className="lf-rehearse-input" onSubmit={(event) => {
        event.preventDefault();
        if (text.trim()) send(text.trim());
      }}>
        <input type="text" className="form-control form-control-sm" value={text} maxLength={1000}
               placeholder={s.placeholder} aria-label={s.placeholder} disabled={busy || !waiting}
               onChange={(event) => setText(event.target.value)} />
        <button type="submit" className="btn btn-sm btn-primary" disabled={busy || !waiting || !text.trim()}>
          {s.send}
        </button>
      </form>
      <div className="lf-rehearse-actions">
        <button type="button" className="btn btn-sm btn-link" disabled={busy || !waiting}
                onClick={() => send(null)}>{s.silent}</button>
        <button type="button" className="btn btn-sm btn-outline-secondary" disabled={busy}
                onClick={() => restart(version)}>{s.restart}</button>
      </div>
    </aside>
  );
}
