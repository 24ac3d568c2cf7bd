// Automatic layout (@dagrejs/dagre): steps in ranks from left to right, following the edges, so
// every edge leaves a step's right side (its outputs) and enters the next one's left side (its
// input) without looping back, with room between ranks for the edges' labels. Used by "Organizar"
// and for graphs saved without positions (written through the API).
import { Graph, layout } from '@dagrejs/dagre';
import { outputsOf } from './graph.js';

/** A step's width on the canvas (builder.css .lf-node: min = max width). */
export const NODE_WIDTH = 220;
const RANK_GAP = 90; // wide enough for an edge label ("Sem resposta") between two ranks
const NODE_GAP = 36;

/** A step's height before React Flow has measured it: its head, name, summary and outputs. */
export function estimatedHeight(type, config) {
  return 78 + 24 * outputsOf(type, config || {}).length;
}

/** The top left corner of each step, by id, laid out left to right. `nodes` are React Flow nodes
 * (their measured size is used when known); `edges` anything with source and target. The graph
 * starts at (0, 0); edges to unknown steps are ignored. */
export function layoutPositions(nodes, edges) {
  const graph = new Graph({ multigraph: true });
  graph.setGraph({ rankdir: 'LR', ranksep: RANK_GAP, nodesep: NODE_GAP, marginx: 0, marginy: 0 });
  graph.setDefaultEdgeLabel(() => ({}));
  const sizes = new Map();
  for (const node of nodes) {
    const measured = node.measured || {};
    const size = {
      width: Math.max(measured.width || 0, NODE_WIDTH),
      height: measured.height || estimatedHeight(node.data.type, node.data.config),
    };
    sizes.set(node.id, size);
    graph.setNode(node.id, size);
  }
  edges.forEach((edge, index) => {
    if (sizes.has(edge.source) && sizes.has(edge.target) && edge.source !== edge.target) {
      graph.setEdge(edge.source, edge.target, {}, `e${index}`);
    }
  });
  layout(graph);
  const out = new Map();
  for (const node of nodes) {
    const placed = graph.node(node.id);
    const size = sizes.get(node.id);
    out.set(node.id, { x: Math.round(placed.x - size.width / 2), y: Math.round(placed.y - size.height / 2) });
  }
  return out;
}
