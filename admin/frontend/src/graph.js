// The flow graph as the engine stores it (engine/flows/schema.py) <-> React Flow's nodes and edges.
//
// The engine rejects unknown keys, so what goes back to the server is rebuilt from the schema's
// own keys only (id, type, label, position, config; id, source, target, condition, priority) and
// never carries React Flow's bookkeeping (selected, measured, dragging, width …).
import { layoutPositions } from './layout.js';

/** Every node type the engine knows (engine/flows/schema.py NODE_TYPES): each one is drawn with its outputs. */
export const NODE_TYPES = ['trigger', 'wait', 'condition', 'ai_classify', 'ask', 'action', 'do', 'end'];
/** The types the side panel edits with a form (every type but none). */
export const PALETTE_TYPES = ['trigger', 'wait', 'condition', 'ai_classify', 'ask', 'action', 'do', 'end'];
/** What the palette offers: each item a node type with its first config; `offer_slots` is a `do`
 * step with that action already chosen (its words are `strings.palette[key]`, else the type's). */
export const PALETTE = [
  { key: 'trigger', type: 'trigger' }, { key: 'wait', type: 'wait' }, { key: 'condition', type: 'condition' },
  { key: 'ai_classify', type: 'ai_classify' }, { key: 'ask', type: 'ask' }, { key: 'action', type: 'action' },
  { key: 'do', type: 'do' }, { key: 'offer_slots', type: 'do', config: () => doConfig('offer_slots') },
  { key: 'end', type: 'end' },
];

/** A `do` node's exits by its action (engine/flows/validate.py DO_EXITS). */
export const DO_EXITS = {
  confirm: ['ok', 'failed'], cancel: ['ok', 'failed'], move: ['ok', 'failed', 'unavailable'],
  book: ['ok', 'failed', 'unavailable'], offer_slots: ['ok', 'failed', 'unavailable', 'no_reply'],
  notify_staff: ['ok'], handoff: ['ok'], set_stage: ['ok'], start_flow: ['ok', 'failed'], notify_clinic: ['ok'],
};
/** Every exit a `do` node may have (validate.py ALLOWED_EDGES["do"]): shown while its action is unknown. */
const DO_ANY = ['ok', 'failed', 'unavailable', 'no_reply'];
/** Edge conditions without a value whose handle is the condition type itself. */
const PLAIN_EXITS = new Set(['no_reply', 'replied', 'complete', 'gave_up', 'ok', 'failed', 'unavailable']);

/** A new node's config: a valid shape where one is obvious, left for the person where not. */
export function defaultConfig(type) {
  switch (type) {
    case 'wait': return { mode: 'fixed', minutes: 1440 };
    case 'condition': return { checks: [{ field: 'enrollment.replies', op: 'eq', value: 0 }], combinator: 'all' };
    case 'ai_classify': return { classes: [], grace_minutes: 60 };
    case 'action': return { mode: 'template' };
    // No outcome picked for the person: "Convertido" would count every new end as a success.
    case 'end': return {};
    case 'ask': return { fields: [], max_asks: 3 };
    case 'do': return {};
    default: return {};
  }
}

/** A `do` step's first config for `action`: the action and the required values a form starts from. */
export function doConfig(action) {
  switch (action) {
    case 'offer_slots': return { action, limit: 3, same_professional: true, max_asks: 2 };
    case 'notify_staff': return { action, note: '' };
    case 'set_stage': return { action, stage: '' };
    case 'notify_clinic': return { action, signal: '' };
    default: return { action };
  }
}

/** A new step's name in the reader's words: its kind and the first number no step of the graph
 * uses in that name yet ("Esperar 2"). The node id stays an engine-safe slug (`newNodeId`). */
export function newNodeLabel(kindName, labels) {
  for (let n = 1; ; n += 1) {
    const label = `${kindName} ${n}`;
    if (!labels.has(label)) return label;
  }
}

const ID_PREFIX = {
  trigger: 'gatilho', wait: 'espera', condition: 'condicao', ai_classify: 'classificar', ask: 'pergunta',
  action: 'mensagem', do: 'acao', end: 'fim',
};

/** A node id the graph does not use yet ("espera_2"), within the schema's [A-Za-z0-9_-]{1,64}. */
export function newNodeId(type, taken) {
  const prefix = ID_PREFIX[type] || 'etapa';
  for (let n = 1; ; n += 1) {
    const id = `${prefix}_${n}`;
    if (!taken.has(id)) return id;
  }
}

/** An edge id the graph does not use yet. */
export function newEdgeId(taken) {
  for (let n = 1; ; n += 1) {
    const id = `ligacao_${n}`;
    if (!taken.has(id)) return id;
  }
}

/** The outputs a node offers, each a React Flow source handle: [{handle, condition, labelKey, text?}]. */
export function outputsOf(type, config) {
  switch (type) {
    case 'trigger':
    case 'action':
      return [{ handle: 'always', condition: { type: 'always' }, labelKey: 'always' }];
    case 'wait':
      return [
        { handle: 'always', condition: { type: 'always' }, labelKey: 'always' },
        { handle: 'replied', condition: { type: 'replied' }, labelKey: 'replied' },
      ];
    case 'condition':
      return [
        { handle: 'true', condition: { type: 'cond_result', value: true }, labelKey: 'cond_true' },
        { handle: 'false', condition: { type: 'cond_result', value: false }, labelKey: 'cond_false' },
      ];
    case 'ai_classify': {
      const classes = Array.isArray(config && config.classes) ? config.classes.filter((c) => typeof c === 'string') : [];
      return [
        ...classes.map((name) => ({
          handle: `class:${name}`, condition: { type: 'class_match', value: name }, text: classLabel(config, name),
        })),
        { handle: 'no_reply', condition: { type: 'no_reply' }, labelKey: 'no_reply' },
        { handle: 'always', condition: { type: 'always' }, labelKey: 'fallback' },
      ];
    }
    case 'ask':
      return ['complete', 'gave_up', 'no_reply'].map(plainOutput);
    case 'do': {
      const action = config && typeof config.action === 'string' ? config.action : null;
      return (Object.prototype.hasOwnProperty.call(DO_EXITS, action) ? DO_EXITS[action] : DO_ANY).map(plainOutput);
    }
    default:
      return [];
  }
}

function plainOutput(type) {
  return { handle: type, condition: { type }, labelKey: type };
}

/** The source handle an edge condition leaves from. */
export function handleOf(condition) {
  if (!condition || typeof condition !== 'object') return 'always';
  switch (condition.type) {
    case 'cond_result': return condition.value === false ? 'false' : 'true';
    case 'class_match': return `class:${condition.value}`;
    default: return PLAIN_EXITS.has(condition.type) ? condition.type : 'always';
  }
}

/** A class as the person named it ("Não quer"); its slug when the step keeps no name for it. */
export function classLabel(config, slug) {
  const labels = config && config.labels && typeof config.labels === 'object' ? config.labels : {};
  return typeof labels[slug] === 'string' && labels[slug] ? labels[slug] : slug;
}

/** The engine-safe slug of a class name a person typed: "Não quer" → "nao_quer" (CLASS_SLUG:
 * a lowercase letter first, then letters, digits and _, at most 40), never `no_reply`, and not
 * one of `taken`. Empty when the name has no letter or digit at all. */
export function classSlug(label, taken = new Set()) {
  let base = String(label).normalize('NFD').replace(/[\u0300-\u036f]/g, '').toLowerCase()
    .replace(/[^a-z0-9]+/g, '_').replace(/^_+|_+$/g, '');
  if (!base) return '';
  if (!/^[a-z]/.test(base)) base = `c_${base}`;
  base = base.slice(0, 36).replace(/_+$/, '');
  if (base === 'no_reply') base = 'no_reply_1';
  let slug = base;
  for (let n = 2; taken.has(slug); n += 1) slug = `${base}_${n}`;
  return slug;
}

/** Keywords typed or pasted at once: "remarcar, sexta; outro dia" (or one a line) → each one. */
export function splitKeywords(text) {
  return String(text).split(/[,;\n]+/).map((k) => k.trim()).filter(Boolean);
}

/** What an edge means, in the reader's words (`strings.edges`); a class edge reads as the class's name. */
export function edgeText(condition, sourceType, strings, sourceConfig) {
  const words = strings.edges;
  if (!condition) return words.always;
  switch (condition.type) {
    case 'cond_result': return condition.value === false ? words.cond_false : words.cond_true;
    case 'class_match': return classLabel(sourceConfig, String(condition.value));
    default:
      if (PLAIN_EXITS.has(condition.type)) return words[condition.type] || condition.type;
      return sourceType === 'ai_classify' ? words.fallback : words.always;
  }
}

function copy(value) {
  return value === undefined ? undefined : JSON.parse(JSON.stringify(value));
}

/** The engine's graph as React Flow state. Keeps what it needs to write the same graph back. */
export function toFlow(graph, strings) {
  const stored = graph.nodes || [];
  // Steps saved without a position are placed where the automatic layout puts them.
  const auto = stored.some((node) => !node.position)
    ? layoutPositions(stored.map((node) => ({ id: node.id, data: { type: node.type, config: node.config } })),
      graph.edges || [])
    : new Map();
  const nodes = stored.map((node) => {
    const placed = node.position ? { x: node.position.x, y: node.position.y } : { ...auto.get(node.id) };
    return {
      id: node.id,
      type: 'lembra',
      position: placed,
      data: {
        type: node.type,
        config: copy(node.config) || {},
        ...(node.label !== undefined ? { label: node.label } : {}),
        // A node stored without a position (one written through the API) is laid out here and
        // saved back without one while it stays where it was put: opening a flow adds no key.
        ...(node.position ? {} : { laidOut: { ...placed } }),
      },
    };
  });
  const dataOf = new Map(nodes.map((n) => [n.id, n.data]));
  const taken = new Set((graph.edges || []).map((e) => e.id).filter(Boolean));
  const edges = (graph.edges || []).map((edge) => {
    const keepId = typeof edge.id === 'string' && edge.id.length > 0;
    const id = keepId ? edge.id : newEdgeId(taken);
    taken.add(id);
    return decorateEdge({
      id,
      source: edge.source,
      target: edge.target,
      sourceHandle: handleOf(edge.condition),
      data: {
        condition: copy(edge.condition),
        ...(edge.priority !== undefined ? { priority: edge.priority } : {}),
        ...(keepId ? {} : { noId: true }),
      },
    }, dataOf.get(edge.source), strings);
  });
  return { nodes, edges };
}

/** An edge with its label and arrow (presentation only; `fromFlow` ignores both). `source` is the
 * source node's data ({type, config}). */
export function decorateEdge(edge, source, strings) {
  const label = edgeText(edge.data.condition, source && source.type, strings, source && source.config);
  return {
    ...edge,
    label,
    // React Flow's own label would read "Edge from gatilho_1 to espera_1" to a screen reader.
    ariaLabel: [strings && strings.ui && strings.ui.edge, label].filter(Boolean).join(': ') || null,
    labelShowBg: true,
    labelBgPadding: [4, 2],
    labelBgBorderRadius: 4,
    markerEnd: { type: 'arrowclosed', width: 18, height: 18 },
    className: `lf-edge lf-edge-${(edge.data.condition && edge.data.condition.type) || 'always'}`,
  };
}

/** React Flow state back to the engine's graph: the schema's keys only. */
export function fromFlow(nodes, edges) {
  return {
    nodes: nodes.map((n) => {
      const out = { id: n.id, type: n.data.type };
      if (n.data.label !== undefined) out.label = n.data.label;
      const laidOut = n.data.laidOut;
      if (!(laidOut && laidOut.x === n.position.x && laidOut.y === n.position.y)) {
        out.position = { x: n.position.x, y: n.position.y };
      }
      out.config = copy(n.data.config) || {};
      return out;
    }),
    edges: edges.map((e) => {
      const out = {};
      if (!e.data.noId) out.id = e.id;
      out.source = e.source;
      out.target = e.target;
      out.condition = copy(e.data.condition);
      if (e.data.priority !== undefined) out.priority = e.data.priority;
      return out;
    }),
  };
}

/** Minutes as whole days, hours and minutes (largest first). */
export function splitMinutes(total) {
  const value = Number.isFinite(total) ? Math.max(0, Math.trunc(total)) : 0;
  return { days: Math.floor(value / 1440), hours: Math.floor((value % 1440) / 60), minutes: value % 60 };
}

export function joinMinutes({ days, hours, minutes }) {
  return (days || 0) * 1440 + (hours || 0) * 60 + (minutes || 0);
}
