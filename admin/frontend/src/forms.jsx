// Forms generated from the engine's JSON Schema (engine.flows.schema.json_schema(), handed over by
// the page): one control per property, chosen by the property's schema, with a few richer controls
// where a bare input would be a poor fit (durations in days/hours/minutes, the template picker with
// its preview, classes as tags, condition checks). Every word comes from `ctx.strings`.
import { useState } from 'react';
import { classLabel, classSlug, doConfig, joinMinutes, splitKeywords, splitMinutes } from './graph.js';

/** "%(name)s" placeholders, as the server's gettext strings write them. */
function fillIn(text, params) {
  return String(text || '').replace(/%\((\w+)\)s/g, (_m, key) => (params[key] !== undefined ? params[key] : ''));
}

/** What is wrong with one value by its JSON Schema, in the catalogue's words (`strings.details`, the
 * same `detail_*` sentences the server's validator answers with); null when nothing is. Checks
 * what the schema states (required, type, length, pattern, range, items); the rules only the
 * server knows still come back from it as issues. */
export function problemOf(schema, value, required, strings) {
  const d = (strings && strings.details) || {};
  const empty = value === undefined || value === null || value === '' || (Array.isArray(value) && value.length === 0);
  if (empty) {
    if (!required) return null;
    if (Array.isArray(value) && schema.minItems) return fillIn(d.detail_list, { min: schema.minItems, max: schema.maxItems });
    return d.detail_required || null;
  }
  const type = mainType(schema);
  if (type === 'string' && typeof value === 'string') {
    if (schema.pattern && !new RegExp(schema.pattern).test(value)) return fillIn(d.detail_slug, { max: schema.maxLength || 40 });
    if (schema.maxLength && value.length > schema.maxLength) return fillIn(d.detail_text, { max: schema.maxLength });
    if (schema.minLength && value.length < schema.minLength) {
      return fillIn(d.detail_text_range, { min: schema.minLength, max: schema.maxLength });
    }
  }
  if ((type === 'integer' || type === 'number') && typeof value === 'number') {
    if ((type === 'integer' && !Number.isInteger(value))
        || (schema.minimum !== undefined && value < schema.minimum)
        || (schema.maximum !== undefined && value > schema.maximum)) {
      if (schema.maximum === undefined) return fillIn(d.detail_integer_min, { min: schema.minimum });
      return fillIn(d.detail_integer_range, { min: schema.minimum, max: schema.maximum });
    }
  }
  if (type === 'array' && Array.isArray(value)) {
    if ((schema.minItems && value.length < schema.minItems) || (schema.maxItems && value.length > schema.maxItems)) {
      return fillIn(d.detail_list, { min: schema.minItems || 0, max: schema.maxItems });
    }
    if (schema.uniqueItems && new Set(value).size !== value.length) return d.detail_repeated || null;
    if (schema.items && schema.items.pattern) {
      const regex = new RegExp(schema.items.pattern);
      if (value.some((v) => typeof v !== 'string' || !regex.test(v))) {
        return fillIn(d.detail_slug, { max: schema.items.maxLength || 40 });
      }
    }
  }
  return null;
}

/** Properties that hold whole minutes: shown as days, hours and minutes. */
const DURATIONS = new Set(['minutes', 'min_minutes', 'max_minutes', 'grace_minutes', 'cooldown_minutes',
  'resume_grace_minutes']);
/** What a required property gets when a person switches to a shape that needs it. */
const FILL = { minutes: 1440, min_minutes: 60, max_minutes: 1440, grace_minutes: 60, cooldown_minutes: 10080 };
/** Properties edited by another one's control (a class's name goes with the class). */
const HIDDEN = new Set(['labels']);
/** Shown after the other properties (the trigger's repeat policy and entry conditions). */
const LAST = ['repeat', 'cooldown_minutes', 'conditions'];

export function resolve(schema, defs) {
  let current = schema;
  while (current && current.$ref) current = defs[current.$ref.replace('#/$defs/', '')];
  return current || {};
}

function mainType(schema) {
  const types = Array.isArray(schema.type) ? schema.type : [schema.type];
  return types.find((t) => t && t !== 'null');
}

function nullable(schema) {
  return Array.isArray(schema.type) && schema.type.includes('null');
}

/** The property that tells a oneOf's shapes apart (`mode`, `kind`): pinned to one value in each. */
function discriminator(variants) {
  const names = Object.keys(variants[0].properties || {});
  return names.find((name) => variants.every((v) => {
    const prop = v.properties && v.properties[name];
    return prop && Array.isArray(prop.enum) && prop.enum.length === 1;
  }));
}

function withoutKey(object, key) {
  const out = { ...object };
  delete out[key];
  return out;
}

/** The form of a config: a oneOf picks its shape by the discriminator, then an object form. */
export function SchemaForm({ schema, value, onChange, ctx }) {
  const resolved = resolve(schema, ctx.defs);
  const current = value && typeof value === 'object' && !Array.isArray(value) ? value : {};
  if (!resolved.oneOf) {
    return <ObjectFields schema={resolved} value={current} onChange={onChange} ctx={ctx} />;
  }
  const variants = resolved.oneOf.map((v) => resolve(v, ctx.defs));
  const key = discriminator(variants);
  const chosen = variants.find((v) => v.properties[key].enum[0] === current[key]);
  const switchTo = (wanted) => {
    const target = variants.find((v) => v.properties[key].enum[0] === wanted);
    const next = {};
    for (const [name, prop] of Object.entries(target.properties)) {
      if (name === key) continue;
      if (current[name] !== undefined) {
        next[name] = current[name];
      } else if ((target.required || []).includes(name)) {
        if (FILL[name] !== undefined) next[name] = FILL[name];
        else if (Array.isArray(prop.enum)) next[name] = prop.enum[0];
      }
    }
    onChange({ [key]: wanted, ...next });
  };
  const labels = (ctx.strings.choices[key]) || {};
  const id = `${ctx.idPrefix}-${key}`;
  return (
    <div className="lf-form">
      <div className="lf-field" data-field={key}>
        <label htmlFor={id}>{ctx.strings.fields[key] || key}</label>
        <select id={id} className="form-control form-control-sm" disabled={ctx.disabled}
                value={chosen ? current[key] : ''} onChange={(e) => switchTo(e.target.value)}>
          {!chosen && <option value="">{ctx.strings.ui.choose}</option>}
          {variants.map((v) => {
            const option = v.properties[key].enum[0];
            return <option key={option} value={option}>{labels[option] || option}</option>;
          })}
        </select>
      </div>
      {chosen && <ObjectFields schema={chosen} value={current} onChange={onChange} ctx={ctx} skip={key} />}
    </div>
  );
}

function ObjectFields({ schema, value, onChange, ctx, skip }) {
  const props = schema.properties || {};
  const names = Object.keys(props).filter((n) => n !== skip && !HIDDEN.has(n));
  names.sort((a, b) => LAST.indexOf(a) - LAST.indexOf(b));
  const set = (name, next) => {
    let updated = next === undefined ? withoutKey(value, name) : { ...value, [name]: next };
    // The one cross-field rule the schema states with if/then: an interval only for "cooldown".
    if (name === 'repeat') {
      if (next === 'cooldown' && updated.cooldown_minutes == null) updated.cooldown_minutes = FILL.cooldown_minutes;
      if (next !== 'cooldown') updated = withoutKey(updated, 'cooldown_minutes');
    }
    onChange(updated);
  };
  // Several properties at once (a class and its name); an undefined value removes its key.
  const patch = (changes) => {
    let updated = { ...value };
    for (const [name, next] of Object.entries(changes)) {
      updated = next === undefined ? withoutKey(updated, name) : { ...updated, [name]: next };
    }
    onChange(updated);
  };
  return (
    <div className="lf-form">
      {names.map((name) => {
        if (name === 'cooldown_minutes' && value.repeat !== 'cooldown') return null;
        return (
          <Field key={name} name={name} schema={resolve(props[name], ctx.defs)} value={value[name]}
                 siblings={value} onChange={(next) => set(name, next)} onPatch={patch} ctx={ctx}
                 required={(schema.required || []).includes(name)} />
        );
      })}
    </div>
  );
}

export function Field({ name, schema, value, onChange, onPatch, ctx, siblings, label, required }) {
  const id = `${ctx.idPrefix}-${name}`;
  const problem = ctx.validate ? problemOf(schema, value, required, ctx.strings) : null;
  const help = ctx.strings.help && ctx.strings.help[name];
  const text = label || ctx.strings.fields[name] || name;
  const disabled = ctx.disabled;
  let control;
  const type = mainType(schema);
  if (DURATIONS.has(name)) {
    control = <Duration id={id} value={value} onChange={onChange} disabled={disabled} ctx={ctx}
                        optional={nullable(schema)} />;
  } else if (name === 'template' || name === 'fallback_template') {
    control = <TemplatePicker id={id} value={value} onChange={onChange} ctx={ctx} optional={nullable(schema)} />;
  } else if (name === 'classes' && onPatch) {
    control = <ClassTags id={id} config={siblings || {}} onPatch={onPatch} ctx={ctx} max={schema.maxItems} />;
  } else if (name === 'classes') {
    control = <Tags id={id} value={value || []} onChange={onChange} ctx={ctx}
                    pattern={schema.items && schema.items.pattern} forbidden={['no_reply']} max={schema.maxItems} />;
  } else if (name === 'fields' && ctx.orgFields) {
    control = <FieldChips id={id} value={Array.isArray(value) ? value : []} onChange={onChange} ctx={ctx} max={schema.maxItems} />;
  } else if (/_field$/.test(name) && ctx.orgFields) {
    control = <FieldPicker id={id} name={name} value={value} onChange={onChange} ctx={ctx} />;
  } else if (name === 'flow_id' && ctx.flows) {
    control = (
      <select id={id} className="form-control form-control-sm" disabled={disabled} value={value ?? ''}
              onChange={(e) => onChange(e.target.value === '' ? undefined : Number(e.target.value))}>
        <option value="">{ctx.strings.ui.choose}</option>
        {ctx.flows.map((f) => <option key={f.id} value={f.id}>{f.name}</option>)}
        {value && !ctx.flows.some((f) => f.id === value) && <option value={value}>{`#${value}`}</option>}
      </select>
    );
  } else if (name === 'keywords') {
    control = <Keywords value={value || {}} classes={(siblings && siblings.classes) || []} labels={siblings} onChange={onChange}
                        ctx={ctx} />;
  } else if (name === 'checks' || name === 'conditions') {
    control = <Checks value={value || []} onChange={onChange} ctx={ctx} max={schema.maxItems || 20} />;
  } else if (name === 'channel_kinds') {
    control = <ChannelKinds value={value} schema={schema} onChange={onChange} ctx={ctx} />;
  } else if (Array.isArray(schema.enum)) {
    const labels = ctx.strings.choices[name] || {};
    const current = value !== undefined ? value : schema.default;
    control = (
      <select id={id} className="form-control form-control-sm" disabled={disabled} value={current ?? ''}
              onChange={(e) => onChange(e.target.value)}>
        {current === undefined && <option value="">{ctx.strings.ui.choose}</option>}
        {schema.enum.map((option) => <option key={option} value={option}>{labels[option] || option}</option>)}
      </select>
    );
  } else if (type === 'integer' || type === 'number') {
    control = (
      <input id={id} type="number" className="form-control form-control-sm" disabled={disabled}
             min={schema.minimum} max={schema.maximum} step={type === 'integer' ? 1 : 'any'}
             value={value ?? ''} placeholder={schema.default !== undefined ? String(schema.default) : ''}
             onChange={(e) => onChange(e.target.value === '' ? undefined : Number(e.target.value))} />
    );
  } else if (type === 'boolean') {
    return (
      <div className="lf-field form-check" data-field={name}>
        <input id={id} type="checkbox" className="form-check-input" disabled={disabled} checked={Boolean(value)}
               onChange={(e) => onChange(e.target.checked)} />
        <label className="form-check-label" htmlFor={id}>{text}</label>
      </div>
    );
  } else {
    const long = (schema.maxLength || 0) > 200;
    const Tag = long ? 'textarea' : 'input';
    control = (
      <Tag id={id} className="form-control form-control-sm" disabled={disabled} maxLength={schema.maxLength}
           rows={long ? 3 : undefined} value={value ?? ''}
           onChange={(e) => onChange(e.target.value === '' && nullable(schema) ? null : e.target.value)} />
    );
  }
  return (
    <div className={`lf-field${problem ? ' has-problem' : ''}`} data-field={name}>
      <label htmlFor={id}>{text}</label>
      {control}
      {help && <small className="lf-help d-block">{help}</small>}
      {problem && <small className="text-danger d-block lf-problem" role="alert">{problem}</small>}
    </div>
  );
}

/** The org's conversation fields as chips: a click adds one (asked in the order chosen) or takes
 * it out; a slug the org no longer declares shows in red until it is removed. */
function FieldChips({ id, value, onChange, ctx, max }) {
  const known = new Map(ctx.orgFields.map((f) => [f.slug, f]));
  const left = ctx.orgFields.filter((f) => !value.includes(f.slug));
  return (
    <div className="lf-chips" id={id}>
      <div className="lf-tag-list">
        {value.map((slug) => (
          <span key={slug} className={`lf-tag${known.has(slug) ? '' : ' lf-tag-unknown'}`} data-chip={slug}>
            {known.has(slug) ? known.get(slug).label : slug}
            {!ctx.disabled && (
              <button type="button" aria-label={`${ctx.strings.ui.remove} ${slug}`}
                      onClick={() => onChange(value.filter((v) => v !== slug))}>×</button>
            )}
          </span>
        ))}
      </div>
      {!ctx.disabled && left.length > 0 && (!max || value.length < max) && (
        <div className="lf-chip-choices">
          {left.map((f) => (
            <button key={f.slug} type="button" className="btn btn-sm btn-outline-secondary lf-chip-add"
                    data-add-chip={f.slug} onClick={() => onChange([...value, f.slug])}>+ {f.label}</button>
          ))}
        </div>
      )}
      {!ctx.orgFields.length && <small className="text-muted d-block">{ctx.strings.ui.no_fields}</small>}
    </div>
  );
}

/** One of the org's fields (optional): where an action reads the patient's day, period or time. */
function FieldPicker({ id, name, value, onChange, ctx }) {
  const wanted = { date_field: 'date', period_field: 'period', time_field: 'time' }[name];
  // The fields of the right type first; any field may be chosen (a text field can hold a day).
  const fields = [...ctx.orgFields].sort((a, b) => (b.type === wanted) - (a.type === wanted));
  return (
    <select id={id} className="form-control form-control-sm" disabled={ctx.disabled} value={value || ''}
            onChange={(e) => onChange(e.target.value === '' ? null : e.target.value)}>
      <option value="">{ctx.strings.ui.none}</option>
      {fields.map((f) => <option key={f.slug} value={f.slug}>{f.label}</option>)}
      {value && !fields.some((f) => f.slug === value) && <option value={value}>{value}</option>}
    </select>
  );
}

/** A `do` step's form: the action from a list, then that action's own settings (its shape in
 * `$defs.config_do`, picked by the action). Switching the action keeps nothing of the other's. */
export function DoForm({ value, onChange, ctx }) {
  const current = value && typeof value === 'object' ? value : {};
  const variants = resolve({ $ref: '#/$defs/config_do' }, ctx.defs).oneOf.map((v) => resolve(v, ctx.defs));
  const actions = variants.flatMap((v) => v.properties.action.enum);
  const chosen = variants.find((v) => v.properties.action.enum.includes(current.action));
  const labels = ctx.strings.choices.action || {};
  const id = `${ctx.idPrefix}-action`;
  const problem = ctx.validate && !chosen ? ctx.strings.details.detail_required : null;
  return (
    <div className="lf-form">
      <div className={`lf-field${problem ? ' has-problem' : ''}`} data-field="action">
        <label htmlFor={id}>{ctx.strings.fields.action}</label>
        <select id={id} className="form-control form-control-sm" disabled={ctx.disabled} value={chosen ? current.action : ''}
                onChange={(e) => onChange(e.target.value ? doConfig(e.target.value) : {})}>
          {!chosen && <option value="">{ctx.strings.ui.choose}</option>}
          {actions.map((a) => <option key={a} value={a}>{labels[a] || a}</option>)}
        </select>
        {chosen && ctx.strings.help[`action_${current.action}`] && (
          <small className="lf-help d-block">{ctx.strings.help[`action_${current.action}`]}</small>
        )}
        {problem && <small className="text-danger d-block lf-problem" role="alert">{problem}</small>}
      </div>
      {chosen && <ObjectFields schema={chosen} value={current} onChange={onChange} ctx={ctx} skip="action" />}
    </div>
  );
}

/** Whole minutes typed as days, hours and minutes. */
export function Duration({ id, value, onChange, disabled, ctx, optional }) {
  const parts = splitMinutes(value ?? 0);
  const empty = value === undefined || value === null;
  const change = (unit, raw) => {
    const next = { ...parts, [unit]: raw === '' ? 0 : Math.max(0, Math.trunc(Number(raw))) };
    const total = joinMinutes(next);
    onChange(optional && total === 0 ? null : total);
  };
  return (
    <div className="lf-duration" id={id}>
      {['days', 'hours', 'minutes'].map((unit) => (
        <label key={unit} className="lf-duration-part">
          <input type="number" min="0" step="1" className="form-control form-control-sm" data-unit={unit}
                 disabled={disabled} value={empty ? '' : parts[unit]} onChange={(e) => change(unit, e.target.value)} />
          <span>{ctx.strings.ui[unit]}</span>
        </label>
      ))}
    </div>
  );
}

function TemplatePicker({ id, value, onChange, ctx, optional }) {
  const choices = ctx.templates;
  const known = choices.find((t) => t.key === value);
  return (
    <div className="lf-template">
      <select id={id} className="form-control form-control-sm" disabled={ctx.disabled} value={value || ''}
              onChange={(e) => onChange(e.target.value === '' ? (optional ? null : undefined) : e.target.value)}>
        <option value="">{optional ? ctx.strings.ui.none : ctx.strings.ui.choose}</option>
        {choices.map((t) => (
          <option key={t.key} value={t.key}>{t.label === t.key ? t.key : `${t.label} (${t.key})`}</option>
        ))}
        {value && !known && <option value={value}>{value}</option>}
      </select>
      {known && (
        <div className="lf-preview">
          <div className="lf-preview-title">{ctx.strings.ui.preview}</div>
          {Object.entries(known.previews).map(([kind, item]) => (
            <div key={kind} className="lf-preview-item">
              <span className="badge badge-light">{item.channel}</span>
              <div className={item.error ? 'text-danger' : 'lf-preview-text'}>
                {item.error || item.text || ctx.strings.ui.no_template_body}
              </div>
            </div>
          ))}
        </div>
      )}
    </div>
  );
}

export function Tags({ id, value, onChange, ctx, pattern, forbidden = [], max, maxLength, split, help }) {
  const [draft, setDraft] = useState('');
  const [bad, setBad] = useState(false);
  const regex = pattern ? new RegExp(pattern) : null;
  const fits = (item) => !((regex && !regex.test(item)) || forbidden.includes(item) || (maxLength && item.length > maxLength));
  const addAll = (text) => {
    // With `split`, "remarcar, sexta, outro dia" is three items (commas, semicolons or lines).
    const items = split ? splitKeywords(text) : [text.trim()].filter(Boolean);
    if (!items.length) return;
    const wrong = items.filter((item) => !fits(item));
    const next = [...value];
    for (const item of items) {
      if (fits(item) && !next.includes(item) && (!max || next.length < max)) next.push(item);
    }
    if (next.length !== value.length) onChange(next);
    setDraft(wrong.join(', '));
    setBad(wrong.length > 0);
  };
  const add = () => addAll(draft);
  return (
    <div className="lf-tags">
      <div className="lf-tag-list">
        {value.map((item) => (
          <span key={item} className="lf-tag" data-tag={item}>
            {item}
            {!ctx.disabled && (
              <button type="button" aria-label={`${ctx.strings.ui.remove} ${item}`}
                      onClick={() => onChange(value.filter((v) => v !== item))}>×</button>
            )}
          </span>
        ))}
      </div>
      {!ctx.disabled && (
        <input id={id} className={`form-control form-control-sm${bad ? ' is-invalid' : ''}`} value={draft}
               onChange={(e) => { setDraft(e.target.value); setBad(false); }}
               onPaste={split ? (e) => {
                 const text = e.clipboardData.getData('text');
                 if (/[,;\n]/.test(text)) { e.preventDefault(); addAll(`${draft}${text}`); }
               } : undefined}
               onKeyDown={(e) => { if (e.key === 'Enter' || e.key === ',') { e.preventDefault(); add(); } }}
               onBlur={add} />
      )}
      {pattern && <small className={bad ? 'text-danger' : 'text-muted'}>{ctx.strings.ui.tags_help}</small>}
      {help && <small className={`d-block ${bad ? 'text-danger' : 'text-muted'}`}>{help}</small>}
    </div>
  );
}

/** Classes named freely ("Não quer"): each gets an engine slug ("nao_quer") the person never reads,
 * and its name is kept in `labels` (only when it differs from the slug). Removing a class takes its
 * name and keywords along. */
function ClassTags({ id, config, onPatch, ctx, max }) {
  const classes = Array.isArray(config.classes) ? config.classes : [];
  const labels = config.labels && typeof config.labels === 'object' ? config.labels : {};
  const [draft, setDraft] = useState('');
  const [bad, setBad] = useState(false);
  const shown = new Set(classes.map((c) => classLabel(config, c).toLowerCase()));
  const add = () => {
    const name = draft.trim();
    if (!name) return;
    const slug = classSlug(name, new Set(classes));
    if (!slug || name.length > 60) { setBad(true); return; }
    if (!shown.has(name.toLowerCase()) && (!max || classes.length < max)) {
      const named = name === slug ? labels : { ...labels, [slug]: name };
      onPatch({ classes: [...classes, slug], labels: Object.keys(named).length ? named : undefined });
    }
    setDraft('');
    setBad(false);
  };
  const remove = (slug) => {
    const named = withoutKey(labels, slug);
    const keywords = config.keywords ? withoutKey(config.keywords, slug) : undefined;
    onPatch({ classes: classes.filter((c) => c !== slug), labels: Object.keys(named).length ? named : undefined,
              ...(config.keywords ? { keywords } : {}) });
  };
  return (
    <div className="lf-tags">
      <div className="lf-tag-list">
        {classes.map((slug) => (
          <span key={slug} className="lf-tag" data-tag={slug}>
            {classLabel(config, slug)}
            {!ctx.disabled && (
              <button type="button" aria-label={`${ctx.strings.ui.remove} ${classLabel(config, slug)}`}
                      onClick={() => remove(slug)}>×</button>
            )}
          </span>
        ))}
      </div>
      {!ctx.disabled && (
        <input id={id} className={`form-control form-control-sm${bad ? ' is-invalid' : ''}`} value={draft}
               onChange={(e) => { setDraft(e.target.value); setBad(false); }}
               onKeyDown={(e) => { if (e.key === 'Enter') { e.preventDefault(); add(); } }}
               onBlur={add} />
      )}
      <small className={bad ? 'text-danger' : 'text-muted'}>{ctx.strings.ui.classes_help}</small>
    </div>
  );
}

function Keywords({ value, classes, labels, onChange, ctx }) {
  if (!classes.length) return <small className="text-muted">—</small>;
  return (
    <div className="lf-keywords">
      {classes.map((cls) => (
        <div key={cls} className="lf-keyword-class">
          <span className="lf-keyword-name">{classLabel(labels, cls)}</span>
          <Tags id={`${ctx.idPrefix}-kw-${cls}`} value={value[cls] || []} ctx={ctx} max={20} maxLength={60} split
                help={ctx.strings.ui.keywords_help}
                onChange={(list) => onChange(list.length ? { ...value, [cls]: list } : withoutKey(value, cls))} />
        </div>
      ))}
    </div>
  );
}

function ChannelKinds({ value, schema, onChange, ctx }) {
  const options = (schema.items && schema.items.enum) || [];
  const current = Array.isArray(value) ? value : (schema.default || options);
  const labels = ctx.strings.choices.channel_kinds || {};
  const toggle = (kind, on) => {
    const set = new Set(current);
    if (on) set.add(kind); else set.delete(kind);
    onChange(options.filter((k) => set.has(k)));
  };
  return (
    <div className="lf-checks-inline">
      {options.map((kind) => (
        <label key={kind} className="mr-3">
          <input type="checkbox" disabled={ctx.disabled} checked={current.includes(kind)} data-kind={kind}
                 onChange={(e) => toggle(kind, e.target.checked)} /> {labels[kind] || kind}
        </label>
      ))}
    </div>
  );
}

/** The fields a check may use, with each one's ops and the value each op takes (from $defs.check). */
function checkRules(defs) {
  const branches = (resolve({ $ref: '#/$defs/check' }, defs).oneOf || []).map((b) => resolve(b, defs));
  const fields = new Map();
  for (const branch of branches) {
    for (const field of branch.properties.field.enum) {
      if (!fields.has(field)) fields.set(field, new Map());
      for (const op of branch.properties.op.enum) fields.get(field).set(op, branch.properties.value);
    }
  }
  return fields;
}

function emptyValue(schema) {
  const type = mainType(schema || {});
  if (!schema || schema.type === 'null') return undefined;
  if (type === 'array') return [];
  if (type === 'integer') return schema.minimum && schema.minimum > 1 ? schema.minimum : 60;
  if (type === 'number') return 0;
  return '';
}

function Checks({ value, onChange, ctx, max }) {
  const rules = checkRules(ctx.defs);
  const fieldLabels = ctx.strings.choices.field || {};
  const opLabels = ctx.strings.choices.op || {};
  const replace = (index, check) => onChange(value.map((c, i) => (i === index ? check : c)));
  const build = (field, op) => {
    const check = { field, op };
    const initial = emptyValue(rules.get(field).get(op));
    if (initial !== undefined) check.value = initial;
    return check;
  };
  const firstField = rules.keys().next().value;
  return (
    <div className="lf-checklist">
      {value.map((check, index) => {
        const ops = rules.get(check.field) || new Map();
        const valueSchema = ops.get(check.op);
        const type = valueSchema ? mainType(valueSchema) : undefined;
        const key = `${ctx.idPrefix}-check-${index}`;
        return (
          <div key={key} className="lf-check" data-check={index}>
            <select className="form-control form-control-sm" disabled={ctx.disabled} value={check.field}
                    aria-label={ctx.strings.fields.field}
                    onChange={(e) => {
                      const op = rules.get(e.target.value).keys().next().value;
                      replace(index, build(e.target.value, op));
                    }}>
              {!rules.has(check.field) && <option value={check.field}>{check.field}</option>}
              {[...rules.keys()].map((f) => <option key={f} value={f}>{fieldLabels[f] || f}</option>)}
            </select>
            <select className="form-control form-control-sm" disabled={ctx.disabled} value={check.op}
                    aria-label={ctx.strings.fields.op}
                    onChange={(e) => {
                      const same = mainType(ops.get(e.target.value) || {}) === type && type !== undefined;
                      replace(index, same ? { ...check, op: e.target.value } : build(check.field, e.target.value));
                    }}>
              {!ops.has(check.op) && <option value={check.op}>{check.op}</option>}
              {[...ops.keys()].map((op) => <option key={op} value={op}>{opLabels[op] || op}</option>)}
            </select>
            {type === 'array' && (
              <textarea className="form-control form-control-sm" rows={2} disabled={ctx.disabled}
                        aria-label={ctx.strings.fields.value} title={ctx.strings.ui.values_help}
                        placeholder={ctx.strings.ui.values_help}
                        value={Array.isArray(check.value) ? check.value.join('\n') : ''}
                        onChange={(e) => replace(index, {
                          ...check, value: e.target.value.split('\n').map((s) => s.trim()).filter(Boolean),
                        })} />
            )}
            {(type === 'integer' || type === 'number') && (
              <input type="number" className="form-control form-control-sm" disabled={ctx.disabled}
                     aria-label={ctx.strings.fields.value} step={type === 'integer' ? 1 : 'any'}
                     min={valueSchema.minimum} value={check.value ?? ''}
                     onChange={(e) => replace(index, { ...check, value: e.target.value === '' ? null : Number(e.target.value) })} />
            )}
            {type === 'string' && (
              <input className="form-control form-control-sm" disabled={ctx.disabled} maxLength={valueSchema.maxLength}
                     aria-label={ctx.strings.fields.value} value={check.value ?? ''}
                     onChange={(e) => replace(index, { ...check, value: e.target.value })} />
            )}
            {!ctx.disabled && (
              <button type="button" className="btn btn-sm btn-link text-danger"
                      onClick={() => onChange(value.filter((_c, i) => i !== index))}>{ctx.strings.ui.remove}</button>
            )}
          </div>
        );
      })}
      {!ctx.disabled && value.length < max && firstField && (
        <button type="button" className="btn btn-sm btn-outline-secondary"
                onClick={() => onChange([...value, build(firstField, rules.get(firstField).keys().next().value)])}>
          {ctx.strings.ui.add_check}
        </button>
      )}
    </div>
  );
}
