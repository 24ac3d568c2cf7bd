// The flow graph as the engine stores it (engine/flows/schema.py) <-> React Flow's nodes and edges.
//
// The engine rejects unknown keys, so what goes back to the server is rebuilt from the schema's
// own keys only (id, type, label, position, config; id, source, target, condition, priority) and
// never carries React Flow's bookkeeping (selected, measured, dragging, width …).

/** Every node type the engine knows (engine/flows/schema.py NODE_TYPES): each one is drawn with its outputs. */
export const NODE_TYPES = ['trigger', 'wait', 'condition', 'ai_classify', 'ask', 'action', 'do', 'end'];
/** The types the palette offers and the side panel edits with a form. `ask` and `do` are drawn,
 * connected and saved back as they are, but their config is changed through the API until the
 * console issue gives them forms (the panel shows it read-only). */
export const PALETTE_TYPES = ['trigger', 'wait', 'condition', 'ai_classify', 'action', 'end'];

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
    case 'end': return { outcome: 'converted' };
    case 'ask': return { fields: [] };
    case 'do': return { action: 'handoff' };
    default: return {};
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
        ...classes.map((name) => ({ handle: `class:${name}`, condition: { type: 'class_match', value: name }, text: name })),
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

/** What an edge means, in the reader's words (`strings.edges`). */
export function edgeText(condition, sourceType, strings) {
  const words = strings.edges;
  if (!condition) return words.always;
  switch (condition.type) {
    case 'cond_result': return condition.value === false ? words.cond_false : words.cond_true;
    case 'class_match': return String(condition.value);
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
  const nodes = (graph.nodes || []).map((node, index) => {
    const placed = node.position ? { x: node.position.x, y: node.position.y } : { x: 40 + 240 * index, y: 80 };
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
  const typeOf = new Map(nodes.map((n) => [n.id, n.data.type]));
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
    }, typeOf.get(edge.source), strings);
  });
  return { nodes, edges };
}

/** An edge with its label and arrow (presentation only; `fromFlow` ignores both). */
export function decorateEdge(edge, sourceType, strings) {
  return {
    ...edge,
    label: edgeText(edge.data.condition, sourceType, strings),
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
