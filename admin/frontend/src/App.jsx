// The builder: a toolbar (save state, Salvar rascunho, Publicar, Desativar), the palette of the six
// step types that have forms, the React Flow canvas (ask and do steps too, their config shown
// read-only in the panel) and a side panel (the selected step's or the flow's settings, the
// publish problems, the version history) and "Testar", the chat that plays the patient (TestPanel.jsx).
import { useCallback, useEffect, useMemo, useRef, useState } from 'react';
import {
  Background, MiniMap, ReactFlow, applyEdgeChanges, applyNodeChanges, useNodesInitialized, useReactFlow,
} from '@xyflow/react';
import { RequestFailed, postJSON } from './api.js';
import { DoForm, Duration, Field, SchemaForm } from './forms.jsx';
import {
  PALETTE, PALETTE_TYPES, decorateEdge, defaultConfig, edgeText, fromFlow, newEdgeId, newNodeId, newNodeLabel,
  outputsOf, toFlow,
} from './graph.js';
import { layoutPositions } from './layout.js';
import { BuilderContext, FlowNode } from './nodes.jsx';
import { RehearsalPanel } from './TestPanel.jsx';

const NODE_COMPONENTS = { lembra: FlowNode };
const AUTOSAVE_MS = 1200;
/** The view: the whole flow when it fits, but never so far out that a step's text drops under 12 px
 * (the smallest node text is 14 px: at 0.9 it reads as 12.6 px); the minimap and panning reach the rest. */
const FIT = { minZoom: 0.9, maxZoom: 1, margin: 28 };
const SETTINGS = ['name', 'trigger_config', 'handoff_policy', 'cancel_on_reply', 'max_steps', 'resume_grace_minutes'];

/** "%(name)s" placeholders, as the server's gettext strings write them. */
export function fill(text, params) {
  return String(text).replace(/%\((\w+)\)s/g, (_m, key) => (params[key] !== undefined ? params[key] : ''));
}

function settingsOf(flow) {
  const out = {};
  for (const key of SETTINGS) out[key] = flow[key];
  return out;
}

function errorText(error, strings) {
  if (error instanceof RequestFailed && error.body && error.body.error) return error.body.error;
  return strings.ui.error;
}

function ariaConfig(aria) {
  return {
    ...aria,
    'node.a11yDescription.ariaLiveMessage': ({ direction, x, y }) => fill(aria.move, {
      direction: (aria.directions && aria.directions[direction]) || direction, x, y,
    }),
  };
}

export function App({ boot }) {
  const strings = boot.strings;
  const ui = strings.ui;
  const canEdit = boot.can_edit;
  const urls = boot.urls;
  const initial = useMemo(() => toFlow(boot.flow.draft_graph || { nodes: [], edges: [] }, strings), []);
  const [nodes, setNodes] = useState(initial.nodes);
  const [edges, setEdges] = useState(initial.edges);
  const [settings, setSettings] = useState(() => settingsOf(boot.flow));
  const [flow, setFlow] = useState(boot.flow);
  const [versions, setVersions] = useState(boot.versions);
  const [selection, setSelection] = useState(null); // {kind: 'node'|'edge', id}
  const [tab, setTab] = useState('config');
  const [issues, setIssues] = useState([]);
  const [revision, setRevision] = useState(0);
  const [savedRevision, setSavedRevision] = useState(0);
  const [saveState, setSaveState] = useState({ kind: 'saved', at: boot.flow.updated_at_text });
  const [notice, setNotice] = useState(null); // {kind: 'success'|'danger'|'info', text, links?}
  const [busy, setBusy] = useState(false);
  const [confirmDisable, setConfirmDisable] = useState(false);
  const [showMap, setShowMap] = useState(false);
  const wrapper = useRef(null);
  const saving = useRef(null);
  // The last revision the server has (set as soon as a save returns, before React renders again).
  const savedRef = useRef(0);
  const { screenToFlowPosition, setCenter, getNode, getNodes, getNodesBounds, setViewport, zoomIn, zoomOut } = useReactFlow();
  const nodesReady = useNodesInitialized();
  const dirty = revision !== savedRevision;

  const touch = useCallback(() => setRevision((r) => r + 1), []);

  // --- saving --------------------------------------------------------------------------------------
  const latest = useRef({});
  latest.current = { nodes, edges, settings, revision };

  const save = useCallback(async () => {
    if (!canEdit) return true;
    if (saving.current) return saving.current;
    const { nodes: n, edges: e, settings: s, revision: sent } = latest.current;
    const body = { ...s, draft_graph: fromFlow(n, e) };
    setSaveState({ kind: 'saving' });
    const request = (async () => {
      try {
        const data = await postJSON(urls.save, body);
        setFlow(data.flow);
        setVersions(data.versions);
        savedRef.current = sent;
        setSavedRevision(sent);
        setSaveState({ kind: 'saved', at: data.flow.updated_at_text });
        setIssues((old) => old.filter((i) => i.source === 'publish'));
        return true;
      } catch (error) {
        setSaveState({ kind: 'failed', text: errorText(error, strings) });
        if (error instanceof RequestFailed && error.body.issues) {
          setIssues(error.body.issues.map((i) => ({ ...i, source: 'save' })));
          setTab('issues');
        }
        return false;
      } finally {
        saving.current = null;
      }
    })();
    saving.current = request;
    return request;
  }, [canEdit, urls.save, strings]);

  // Auto-save a moment after the last change; a save that returns with newer changes pending
  // (savedRevision moves, revision does not) schedules the next one.
  useEffect(() => {
    if (!dirty || !canEdit) return undefined;
    const timer = setTimeout(() => { save(); }, AUTOSAVE_MS);
    return () => clearTimeout(timer);
  }, [revision, savedRevision, dirty, canEdit, save]);

  /** Every change saved (waiting for a save in flight first); false when the server refused one. */
  const flush = useCallback(async () => {
    for (let round = 0; round < 5; round += 1) {
      if (saving.current) {
        await saving.current;
      } else if (latest.current.revision !== savedRef.current) {
        if (!(await save())) return false;
      } else {
        return true;
      }
    }
    return latest.current.revision === savedRef.current;
  }, [save]);

  useEffect(() => {
    const warn = (event) => {
      if (latest.current.revision !== savedRef.current) {
        event.preventDefault();
        event.returnValue = ui.leave;
        return ui.leave;
      }
      return undefined;
    };
    window.addEventListener('beforeunload', warn);
    return () => window.removeEventListener('beforeunload', warn);
  }, []);
  // --- canvas changes ------------------------------------------------------------------------------
  const onNodesChange = useCallback((changes) => {
    setNodes((current) => applyNodeChanges(changes, current));
    if (changes.some((c) => c.type === 'remove' || (c.type === 'position' && c.dragging === false) || c.type === 'add')) {
      touch();
    }
  }, [touch]);

  const onEdgesChange = useCallback((changes) => {
    setEdges((current) => applyEdgeChanges(changes, current));
    if (changes.some((c) => c.type === 'remove' || c.type === 'add')) touch();
  }, [touch]);

  const onConnect = useCallback((connection) => {
    if (!canEdit || connection.source === connection.target) return;
    const source = latest.current.nodes.find((n) => n.id === connection.source);
    if (!source) return;
    const output = outputsOf(source.data.type, source.data.config).find((o) => o.handle === connection.sourceHandle);
    if (!output) return;
    setEdges((current) => {
      // One edge per output: connecting an output again moves its edge.
      const kept = current.filter((e) => !(e.source === connection.source && e.sourceHandle === connection.sourceHandle));
      const id = newEdgeId(new Set(current.map((e) => e.id)));
      const edge = decorateEdge({
        id, source: connection.source, target: connection.target, sourceHandle: connection.sourceHandle,
        data: { condition: { ...output.condition } },
      }, source.data, strings);
      return [...kept, edge];
    });
    touch();
  }, [canEdit, strings, touch]);

  const onDragOver = useCallback((event) => {
    event.preventDefault();
    event.dataTransfer.dropEffect = 'move';
  }, []);

  const addNode = useCallback((key, position) => {
    const item = PALETTE.find((p) => p.key === key);
    const type = item.type;
    const present = latest.current.nodes;
    const id = newNodeId(type, new Set(present.map((n) => n.id)));
    // Named in the reader's words ("Esperar 2"); the id stays the engine's slug ("espera_2").
    const label = newNodeLabel(paletteWords(strings, item).name, new Set(present.map((n) => n.data.label)));
    const config = item.config ? item.config() : defaultConfig(type);
    const node = { id, type: 'lembra', position, selected: true, data: { type, label, config } };
    setNodes((current) => [...current.map((n) => (n.selected ? { ...n, selected: false } : n)), node]);
    setEdges((current) => current.map((e) => (e.selected ? { ...e, selected: false } : e)));
    setSelection({ kind: 'node', id });
    setTab('config');
    touch();
  }, [touch, strings]);

  const onDrop = useCallback((event) => {
    event.preventDefault();
    const key = event.dataTransfer.getData('application/x-lembra-node');
    if (!canEdit || !PALETTE.some((p) => p.key === key)) return;
    const point = screenToFlowPosition({ x: event.clientX, y: event.clientY });
    addNode(key, { x: Math.round(point.x - 90), y: Math.round(point.y - 30) });
  }, [canEdit, screenToFlowPosition, addNode]);

  /** The whole flow in view when it fits at a readable zoom; else the view starts where the flow
   * starts (its left, its top), so the trigger is in sight, and the rest is a pan away. */
  const fitView = useCallback((options = {}) => {
    const shown = getNodes();
    const box = wrapper.current && wrapper.current.getBoundingClientRect();
    if (!shown.length || !box || !box.width) return;
    const bounds = getNodesBounds(shown);
    const room = { width: box.width - 2 * FIT.margin, height: box.height - 2 * FIT.margin };
    const fits = Math.min(room.width / Math.max(bounds.width, 1), room.height / Math.max(bounds.height, 1));
    const zoom = Math.min(FIT.maxZoom, Math.max(FIT.minZoom, fits));
    const place = (start, size, space) => (size * zoom <= space
      ? FIT.margin + (space - size * zoom) / 2 - start * zoom : FIT.margin - start * zoom);
    setViewport({
      x: place(bounds.x, bounds.width, room.width), y: place(bounds.y, bounds.height, room.height), zoom,
    }, options.duration ? { duration: options.duration } : undefined);
  }, [getNodes, getNodesBounds, setViewport]);

  // The first view, once React Flow has measured the steps (an empty flow keeps its view: the
  // first step dropped must stay where it was dropped); and the view after "Organizar".
  const firstFit = useRef(initial.nodes.length === 0);
  const fitAfterLayout = useRef(false);
  useEffect(() => {
    if (nodesReady && !firstFit.current) {
      firstFit.current = true;
      fitView();
    }
  }, [nodesReady, fitView]);
  useEffect(() => {
    if (!fitAfterLayout.current) return undefined;
    fitAfterLayout.current = false;
    const frame = window.requestAnimationFrame(() => fitView({ duration: 200 }));
    return () => window.cancelAnimationFrame(frame);
  }, [nodes, fitView]);

  /** "Organizar": every step where the automatic layout puts it (left to right), then the view. */
  const organize = useCallback(() => {
    const placed = layoutPositions(latest.current.nodes, latest.current.edges);
    setNodes((current) => current.map((n) => (placed.has(n.id) ? { ...n, position: placed.get(n.id) } : n)));
    touch();
    fitAfterLayout.current = true; // the view once React Flow has the new positions
  }, [touch]);

  const onSelectionChange = useCallback(({ nodes: picked, edges: pickedEdges }) => {
    if (picked.length === 1) setSelection({ kind: 'node', id: picked[0].id });
    else if (pickedEdges.length === 1 && !picked.length) setSelection({ kind: 'edge', id: pickedEdges[0].id });
    else if (!picked.length && !pickedEdges.length) setSelection(null);
  }, []);

  const focusNode = useCallback((id) => {
    const node = getNode(id);
    if (!node) return;
    setNodes((current) => current.map((n) => ({ ...n, selected: n.id === id })));
    setEdges((current) => current.map((e) => (e.selected ? { ...e, selected: false } : e)));
    setSelection({ kind: 'node', id });
    setTab('config');
    const width = (node.measured && node.measured.width) || 180;
    const height = (node.measured && node.measured.height) || 80;
    setCenter(node.position.x + width / 2, node.position.y + height / 2, { zoom: 1, duration: 300 });
  }, [getNode, setCenter]);

  // --- editing the selected step -------------------------------------------------------------------
  const updateNode = useCallback((id, change) => {
    setNodes((current) => current.map((n) => (n.id === id ? { ...n, data: change(n.data) } : n)));
    if (change) touch();
  }, [touch]);

  const setConfig = useCallback((id, config) => {
    const node = latest.current.nodes.find((n) => n.id === id);
    if (!node) return;
    let next = config;
    if (node.data.type === 'ai_classify') {
      // Keywords are only for declared classes, and a removed class takes its output's edge along.
      const classes = Array.isArray(next.classes) ? next.classes : [];
      for (const key of ['keywords', 'labels']) {
        if (next[key]) {
          const kept = Object.fromEntries(Object.entries(next[key]).filter(([k]) => classes.includes(k)));
          next = { ...next, [key]: kept };
        }
      }
      if (next.labels && !Object.keys(next.labels).length) {
        next = { ...next };
        delete next.labels;
      }
      setEdges((current) => current.filter((e) => !(e.source === id && e.data.condition
        && e.data.condition.type === 'class_match' && !classes.includes(e.data.condition.value))));
    }
    updateNode(id, (data) => ({ ...data, config: next }));
    if (node.data.type === 'ai_classify') {
      // A class's edge reads as the class's name: write its label again.
      setEdges((current) => current.map((e) => (e.source === id
        ? decorateEdge(e, { type: node.data.type, config: next }, strings) : e)));
    }
  }, [updateNode, strings]);

  const setLabel = useCallback((id, label) => {
    updateNode(id, (data) => {
      const out = { ...data };
      if (label === '') delete out.label; else out.label = label;
      return out;
    });
  }, [updateNode]);

  const deleteSelected = useCallback(() => {
    if (!selection || !canEdit) return;
    if (selection.kind === 'node') {
      setNodes((current) => current.filter((n) => n.id !== selection.id));
      setEdges((current) => current.filter((e) => e.source !== selection.id && e.target !== selection.id));
    } else {
      setEdges((current) => current.filter((e) => e.id !== selection.id));
    }
    setSelection(null);
    touch();
  }, [selection, canEdit, touch]);

  const changeSettings = useCallback((next) => {
    setSettings(next);
    touch();
  }, [touch]);

  // --- publish, disable, rollback ------------------------------------------------------------------
  const applyState = (data) => {
    setFlow(data.flow);
    setVersions(data.versions);
  };

  const publish = async () => {
    setBusy(true);
    setNotice(null);
    try {
      if (!(await flush())) return;
      const data = await postJSON(urls.publish, {});
      applyState(data);
      setIssues([]);
      setNotice({ kind: 'success', text: fill(ui.published, { versao: data.published }) });
    } catch (error) {
      setNotice({ kind: 'danger', text: errorText(error, strings) });
      if (error instanceof RequestFailed && error.body.issues) {
        setIssues(error.body.issues.map((i) => ({ ...i, source: 'publish' })));
        setTab('issues');
      }
    } finally {
      setBusy(false);
    }
  };

  const simple = async (url, body, message) => {
    setBusy(true);
    setNotice(null);
    try {
      const data = await postJSON(url, body);
      applyState(data);
      setNotice({ kind: 'success', text: message(data) });
    } catch (error) {
      setNotice({ kind: 'danger', text: errorText(error, strings) });
    } finally {
      setBusy(false);
    }
  };

  const disable = (live) => {
    setConfirmDisable(false);
    simple(urls.disable, { live }, () => ui.disabled);
  };

  const rollback = (version) => {
    if (!window.confirm(fill(ui.rollback_confirm, { versao: version }))) return;
    simple(urls.rollback, { version }, (data) => fill(ui.rolled_back, { versao: data.rolled_back }));
  };

  // --- what the canvas shows ------------------------------------------------------------------------
  const issuesByNode = useMemo(() => {
    const map = new Map();
    const ids = new Set(nodes.map((n) => n.id));
    for (const issue of issues) {
      if (issue.node_id && ids.has(issue.node_id)) {
        if (!map.has(issue.node_id)) map.set(issue.node_id, []);
        map.get(issue.node_id).push(issue);
      }
    }
    return map;
  }, [issues, nodes]);

  const fieldLabels = useMemo(() => new Map((boot.fields || []).map((f) => [f.slug, f.label])), [boot.fields]);
  const context = useMemo(() => ({ strings, issues: issuesByNode, fieldLabels }), [strings, issuesByNode, fieldLabels]);
  const aria = useMemo(() => ariaConfig(strings.aria), [strings]);
  const formCtx = {
    defs: boot.schema.$defs, strings, templates: boot.templates, disabled: !canEdit, idPrefix: 'lf',
    orgFields: boot.fields || [], flows: boot.flows || [], validate: canEdit,
  };
  const selectedNode = selection && selection.kind === 'node' ? nodes.find((n) => n.id === selection.id) : null;
  const selectedEdge = selection && selection.kind === 'edge' ? edges.find((e) => e.id === selection.id) : null;
  const status = flow.status;
  const activeVersion = flow.active_version;

  let saveText;
  if (!canEdit) saveText = ui.read_only;
  else if (saveState.kind === 'saving') saveText = ui.saving;
  else if (saveState.kind === 'failed') saveText = `${ui.save_failed} ${saveState.text || ''}`;
  else if (dirty) saveText = ui.unsaved;
  else saveText = fill(ui.saved, { hora: saveState.at || '' });

  return (
    <BuilderContext.Provider value={context}>
      <div className="lf-builder" data-dirty={dirty ? 'true' : 'false'} data-status={status}>
        <div className="lf-toolbar">
          <a className="btn btn-sm btn-link" href={boot.flows_url}>← {ui.back}</a>
          <strong className="lf-flow-name">{settings.name}</strong>
          <span className={`badge lf-status lf-status-${status}`} data-status={status}>
            {strings.status[status] || status}
            {activeVersion ? ` · ${fill(ui.version_short, { versao: activeVersion })}` : ''}
          </span>
          <span className={`lf-save-state lf-save-${dirty ? 'dirty' : saveState.kind}`} role="status">{saveText}</span>
          <span className="lf-spacer" />
          {canEdit && (
            <>
              <button type="button" className="btn btn-sm btn-outline-secondary" disabled={busy}
                      onClick={() => flush()}>{ui.save}</button>
              <button type="button" className="btn btn-sm btn-primary" disabled={busy}
                      onClick={publish}>{ui.publish}</button>
              {status === 'active' && (
                <button type="button" className="btn btn-sm btn-outline-danger" disabled={busy}
                        onClick={() => setConfirmDisable(true)}>{ui.disable}</button>
              )}
            </>
          )}
        </div>
        {notice && (
          <div className={`alert alert-${notice.kind} lf-notice`} role="alert">
            {notice.text}
            {notice.links && notice.links.map((link) => (
              <a key={link.href} className="ml-2" href={link.href}>{link.text}</a>
            ))}
            <button type="button" className="close" aria-label={ui.close} onClick={() => setNotice(null)}>×</button>
          </div>
        )}
        {confirmDisable && (
          <div className="alert alert-warning lf-notice" role="dialog" aria-label={ui.disable_title}>
            <strong>{ui.disable_title}.</strong> {ui.disable_help}
            <button type="button" className="btn btn-sm btn-outline-secondary ml-2" onClick={() => disable('finish')}>
              {ui.disable_finish}
            </button>
            <button type="button" className="btn btn-sm btn-danger ml-2" onClick={() => disable('cancel')}>
              {ui.disable_cancel}
            </button>
            <button type="button" className="btn btn-sm btn-link" onClick={() => setConfirmDisable(false)}>
              {ui.cancel}
            </button>
          </div>
        )}
        <div className="lf-main">
          {canEdit && (
            <aside className="lf-palette" aria-label={ui.palette}>
              <h6>{ui.palette}</h6>
              <p className="lf-help">{ui.palette_help}</p>
              {PALETTE.map((item) => (
                <div key={item.key} className={`lf-palette-item lf-node-${item.type}`} draggable data-palette={item.key}
                     onDragStart={(event) => {
                       event.dataTransfer.setData('application/x-lembra-node', item.key);
                       event.dataTransfer.effectAllowed = 'move';
                     }}>
                  <strong>{paletteWords(strings, item).name}</strong>
                  <small>{paletteWords(strings, item).help}</small>
                </div>
              ))}
            </aside>
          )}
          <div className="lf-canvas" ref={wrapper} onDragOver={onDragOver} onDrop={onDrop}>
            <ReactFlow
              nodes={nodes} edges={edges} nodeTypes={NODE_COMPONENTS}
              onNodesChange={onNodesChange} onEdgesChange={onEdgesChange} onConnect={onConnect}
              onSelectionChange={onSelectionChange}
              nodesDraggable={canEdit} nodesConnectable={canEdit} elementsSelectable
              deleteKeyCode={canEdit ? ['Backspace', 'Delete'] : null}
              minZoom={0.2} maxZoom={2}
              ariaLabelConfig={aria}
            >
              <Background gap={20} />
              {showMap && (
                <MiniMap pannable zoomable position="top-right" style={{ width: 160, height: 100 }}
                         ariaLabel={strings.aria['minimap.ariaLabel']} />
              )}
            </ReactFlow>
            <div className="lf-zoom">
              <button type="button" className="btn btn-sm btn-light" title={strings.aria['controls.zoomIn.ariaLabel']}
                      aria-label={strings.aria['controls.zoomIn.ariaLabel']} onClick={() => zoomIn()}>+</button>
              <button type="button" className="btn btn-sm btn-light" title={strings.aria['controls.zoomOut.ariaLabel']}
                      aria-label={strings.aria['controls.zoomOut.ariaLabel']} onClick={() => zoomOut()}>−</button>
              <button type="button" className="btn btn-sm btn-light" title={ui.zoom_fit}
                      onClick={() => fitView({ duration: 200 })}>{ui.zoom_fit}</button>
              {canEdit && (
                <button type="button" className="btn btn-sm btn-light" data-action="organize" title={ui.organize_help}
                        disabled={!nodes.length} onClick={organize}>{ui.organize}</button>
              )}
              <button type="button" className="btn btn-sm btn-light" aria-pressed={showMap} data-action="minimap"
                      onClick={() => setShowMap((on) => !on)}>{showMap ? ui.minimap_hide : ui.minimap_show}</button>
            </div>
          </div>
          {canEdit && boot.urls.rehearse && <RehearsalPanel boot={boot} />}
          <aside className="lf-side">
            <ul className="nav nav-tabs lf-tabs" role="tablist">
              {[['config', selectedNode ? ui.node : selectedEdge ? ui.edge : ui.settings],
                ['issues', `${ui.tab_problems}${issues.length ? ` (${issues.length})` : ''}`],
                ['history', ui.tab_history]].map(([key, text]) => (
                <li key={key} className="nav-item">
                  <button type="button" role="tab" aria-selected={tab === key} data-tab={key}
                          className={`nav-link${tab === key ? ' active' : ''}`} onClick={() => setTab(key)}>{text}</button>
                </li>
              ))}
            </ul>
            <div className="lf-side-body">
              {tab === 'config' && selectedNode && (
                <NodePanel node={selectedNode} ctx={formCtx} strings={strings} canEdit={canEdit}
                           issues={issuesByNode.get(selectedNode.id) || []}
                           onConfig={(config) => setConfig(selectedNode.id, config)}
                           onLabel={(label) => setLabel(selectedNode.id, label)} onDelete={deleteSelected} />
              )}
              {tab === 'config' && selectedEdge && (
                <EdgePanel edge={selectedEdge} nodes={nodes} strings={strings} canEdit={canEdit} onDelete={deleteSelected} />
              )}
              {tab === 'config' && !selectedNode && !selectedEdge && (
                <SettingsPanel settings={settings} onChange={changeSettings} ctx={formCtx} strings={strings}
                               issues={issues.filter((i) => !i.node_id)} />
              )}
              {tab === 'issues' && (
                <>
                  <h6>{ui.problems}</h6>
                  <IssueList issues={issues} nodes={nodes} strings={strings} onPick={focusNode} />
                </>
              )}
              {tab === 'history' && <h6>{ui.history}</h6>}
              {tab === 'history' && (
                <History versions={versions} active={activeVersion} strings={strings} canEdit={canEdit} busy={busy}
                         onRollback={rollback} />
              )}
            </div>
          </aside>
        </div>
      </div>
    </BuilderContext.Provider>
  );
}

/** A palette item's name and help: its own words (a preset), else its node type's. */
function paletteWords(strings, item) {
  return (strings.palette && strings.palette[item.key]) || strings.node_types[item.type];
}

function NodePanel({ node, ctx, strings, canEdit, issues, onConfig, onLabel, onDelete }) {
  const kind = strings.node_types[node.data.type] || { name: node.data.type, help: '' };
  const schema = { $ref: `#/$defs/config_${node.data.type}` };
  // Every known type has a form; a `do` step's shapes share an `action` enum, so it has its own.
  const editable = PALETTE_TYPES.includes(node.data.type);
  const nodeCtx = { ...ctx, idPrefix: `lf-${node.id}` };
  return (
    <div className="lf-panel" data-panel="node" data-node-id={node.id}>
      <h6>{kind.name}</h6>
      <p className="lf-help">{kind.help}</p>
      {issues.length > 0 && (
        <ul className="lf-node-issues">
          {issues.map((issue, index) => <li key={index} className="text-danger">{issue.message}</li>)}
        </ul>
      )}
      <Field name="label" schema={{ type: 'string', maxLength: 120 }} value={node.data.label} ctx={ctx}
             onChange={(value) => onLabel(value || '')} />
      {editable && node.data.type === 'do' && <DoForm value={node.data.config} onChange={onConfig} ctx={nodeCtx} />}
      {editable && node.data.type !== 'do' && (
        <SchemaForm schema={schema} value={node.data.config} onChange={onConfig} ctx={nodeCtx} />
      )}
      {!editable && (
        <div className="lf-field" data-field="config" data-read-only="true">
          <label>{strings.ui.config_read_only}</label>
          <p className="lf-help">{strings.ui.config_api_only}</p>
          <pre className="lf-config-json">{JSON.stringify(node.data.config, null, 2)}</pre>
        </div>
      )}
      <small className="text-muted d-block mt-2">{fill(strings.ui.node_id, { id: node.id })}</small>
      {canEdit && (
        <button type="button" className="btn btn-sm btn-outline-danger mt-2" onClick={onDelete}>{strings.ui.delete_node}</button>
      )}
    </div>
  );
}

function EdgePanel({ edge, nodes, strings, canEdit, onDelete }) {
  const source = nodes.find((n) => n.id === edge.source);
  const target = nodes.find((n) => n.id === edge.target);
  const name = (node) => (node ? node.data.label || node.id : '?');
  return (
    <div className="lf-panel" data-panel="edge">
      <h6>{strings.ui.edge}: {edgeText(edge.data.condition, source && source.data.type, strings, source && source.data.config)}</h6>
      <p>{name(source)} → {name(target)}</p>
      {canEdit && (
        <button type="button" className="btn btn-sm btn-outline-danger" onClick={onDelete}>{strings.ui.delete_edge}</button>
      )}
    </div>
  );
}

function SettingsPanel({ settings, onChange, ctx, strings, issues }) {
  const set = (key, value) => onChange({ ...settings, [key]: value });
  const choices = strings.choices.handoff_policy;
  return (
    <div className="lf-panel" data-panel="settings">
      <h6>{strings.ui.settings}</h6>
      <p className="lf-help">{strings.ui.select_hint}</p>
      {issues.length > 0 && (
        <ul className="lf-node-issues">
          {issues.map((issue, index) => <li key={index} className="text-danger">{issue.message}</li>)}
        </ul>
      )}
      <Field name="name" schema={{ type: 'string', maxLength: 120 }} value={settings.name} ctx={{ ...ctx, idPrefix: 'lf-flow' }}
             onChange={(value) => set('name', value || '')} />
      <fieldset className="lf-fieldset">
        <legend>{strings.node_types.trigger.name}</legend>
        <SchemaForm schema={{ $ref: '#/$defs/trigger_config' }} value={settings.trigger_config}
                    onChange={(value) => set('trigger_config', value)} ctx={{ ...ctx, idPrefix: 'lf-trigger' }} />
      </fieldset>
      <Field name="cancel_on_reply" schema={{ type: 'boolean' }} value={settings.cancel_on_reply}
             ctx={{ ...ctx, idPrefix: 'lf-flow' }} onChange={(value) => set('cancel_on_reply', value)} />
      <div className="lf-field" data-field="handoff_policy">
        <label htmlFor="lf-flow-handoff_policy">{strings.fields.handoff_policy}</label>
        <select id="lf-flow-handoff_policy" className="form-control form-control-sm" disabled={ctx.disabled}
                value={settings.handoff_policy} onChange={(e) => set('handoff_policy', e.target.value)}>
          {Object.entries(choices).map(([value, text]) => <option key={value} value={value}>{text}</option>)}
        </select>
      </div>
      <div className="lf-field" data-field="resume_grace_minutes">
        <label htmlFor="lf-flow-resume">{strings.fields.resume_grace_minutes}</label>
        <Duration id="lf-flow-resume" value={settings.resume_grace_minutes} ctx={ctx} disabled={ctx.disabled}
                  onChange={(value) => set('resume_grace_minutes', value ?? 0)} />
      </div>
      <Field name="max_steps" schema={{ type: 'integer', minimum: 1, maximum: 200 }} value={settings.max_steps}
             ctx={{ ...ctx, idPrefix: 'lf-flow' }} onChange={(value) => set('max_steps', value)} />
    </div>
  );
}

function IssueList({ issues, nodes, strings, onPick }) {
  if (!issues.length) return <p className="text-muted">{strings.ui.no_problems}</p>;
  const names = new Map(nodes.map((n) => [n.id, n.data.label || n.id]));
  return (
    <ul className="list-group lf-issues">
      {issues.map((issue, index) => {
        const known = issue.node_id && names.has(issue.node_id);
        return (
          <li key={index} className="list-group-item list-group-item-action" data-issue-node={issue.node_id || ''}
              data-issue-code={issue.code}>
            {known ? (
              <button type="button" className="btn btn-link p-0 text-left" onClick={() => onPick(issue.node_id)}>
                <strong>{names.get(issue.node_id)}</strong>: {issue.message}
              </button>
            ) : (
              <span><strong>{strings.ui.flow_problem}</strong>: {issue.message}</span>
            )}
          </li>
        );
      })}
    </ul>
  );
}

function History({ versions, active, strings, canEdit, busy, onRollback }) {
  const ui = strings.ui;
  if (!versions.length) return <p className="text-muted">{ui.no_versions}</p>;
  return (
    <ul className="list-group lf-history">
      {versions.map((v) => (
        <li key={v.id} className="list-group-item" data-version={v.version}>
          <strong>{fill(ui.version, { versao: v.version })}</strong>
          {v.version === active && <span className="badge badge-success ml-2">{ui.active_version}</span>}
          <div className="small text-muted">
            {fill(ui.by_on, { quem: v.created_by_email || ui.unknown_user, quando: v.created_at_text })}
          </div>
          {canEdit && v.version !== active && (
            <button type="button" className="btn btn-sm btn-outline-secondary mt-1" disabled={busy}
                    onClick={() => onRollback(v.version)}>{fill(ui.rollback, { versao: v.version })}</button>
          )}
        </li>
      ))}
    </ul>
  );
}
