// The one node component of the canvas: the step's type and name, a short summary of its config,
// a badge with its publish problems, and one source handle per output, each labelled with its
// meaning (Sim / Não, a class, Sem resposta, Sempre, Completo, Feito …).
import { createContext, memo, useContext } from 'react';
import { Handle, Position } from '@xyflow/react';
import { outputsOf, splitMinutes } from './graph.js';

/** Words, templates and the issues by node id, shared with every node without touching its data. */
export const BuilderContext = createContext({ strings: null, issues: new Map(), fieldLabels: new Map() });

function duration(minutes, ui) {
  if (!Number.isFinite(minutes)) return '';
  const { days, hours, minutes: rest } = splitMinutes(minutes);
  const parts = [];
  if (days) parts.push(`${days} ${days === 1 ? ui.day : ui.days}`);
  if (hours) parts.push(`${hours} ${hours === 1 ? ui.hour : ui.hours}`);
  if (rest || !parts.length) parts.push(`${rest} ${rest === 1 ? ui.minute : ui.minutes}`);
  return parts.join(' ');
}

function summary(type, config, strings, fieldLabels) {
  const choices = strings.choices;
  const ui = strings.ui;
  switch (type) {
    case 'wait':
      if (config.mode === 'smart') {
        return `${duration(config.min_minutes, ui)} – ${duration(config.max_minutes, ui)}`;
      }
      return duration(config.minutes, ui);
    case 'condition':
      return (config.checks || []).map((c) => `${choices.field[c.field] || c.field} ${choices.op[c.op] || c.op}`
        + (c.value !== undefined && c.value !== null ? ` ${Array.isArray(c.value) ? c.value.join(', ') : c.value}` : '')).join('; ');
    case 'ai_classify':
      return duration(config.grace_minutes, ui);
    case 'action':
      return config.mode === 'ai_message' ? choices.mode.ai_message : (config.template || '');
    case 'ask':
      return Array.isArray(config.fields) ? config.fields.map((f) => fieldLabels.get(f) || f).join(', ') : '';
    case 'do':
      return (choices.action && choices.action[config.action]) || (config.action ? String(config.action) : '');
    case 'end':
      return choices.outcome[config.outcome] || '';
    default:
      return '';
  }
}

function FlowNodeInner({ id, data, selected }) {
  const { strings, issues, fieldLabels } = useContext(BuilderContext);
  const mine = issues.get(id) || [];
  const kind = strings.node_types[data.type] || { name: data.type };
  const outputs = outputsOf(data.type, data.config);
  const text = summary(data.type, data.config || {}, strings, fieldLabels || new Map());
  return (
    <div className={`lf-node lf-node-${data.type}${selected ? ' is-selected' : ''}${mine.length ? ' has-issues' : ''}`}
         data-node-id={id} data-node-type={data.type}>
      {data.type !== 'trigger' && <Handle type="target" position={Position.Left} className="lf-in" />}
      <div className="lf-node-head">
        <span className="lf-node-type">{kind.name}</span>
        {mine.length > 0 && (
          <span className="lf-badge" data-issue-count={mine.length} title={mine.map((i) => i.message).join('\n')}>
            {mine.length}
          </span>
        )}
      </div>
      <div className="lf-node-label">{data.label || id}</div>
      {text && <div className="lf-node-summary">{text}</div>}
      {mine.length > 0 && <div className="lf-node-issue">{mine[0].message}</div>}
      {outputs.length > 0 && (
        <div className="lf-outputs">
          {outputs.map((out) => (
            <div key={out.handle} className="lf-output" data-output={out.handle}>
              <span>{out.text || strings.edges[out.labelKey]}</span>
              <Handle type="source" position={Position.Right} id={out.handle} className="lf-out" />
            </div>
          ))}
        </div>
      )}
    </div>
  );
}

export const FlowNode = memo(FlowNodeInner);
