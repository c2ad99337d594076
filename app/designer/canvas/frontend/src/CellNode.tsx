// One block on the canvas: a header with its label and output, one row per input port, and (while selected) its
// fields. Compact on purpose: the 48 nodes of the LSTM must stay legible when the whole cell is in view. A block of
// several outputs (exp gates: m_next, i, f) draws them as rows of their own on the right, each with its name.
import { memo, useState } from "react";
import { Handle, Position, useNodeConnections, type Node, type NodeProps } from "@xyflow/react";
import type { Option, OptionSpec, OptionValue, Port } from "./types";

export const WARNING = "⚠ ";

export type CellNodeData = {
  label: string;
  blockType: string;
  inputs: Port[];
  outputs: Port[];
  options: Option[];
  specs: OptionSpec[];
  description: string;
  mark?: string;
  onOption: (id: string, name: string, value: OptionValue) => void;
};
export type CellNodeType = Node<CellNodeData, "cell">;

function Field({ spec, value, placeholder, onCommit }: { spec: OptionSpec; value: OptionValue; placeholder: string; onCommit: (v: OptionValue) => void }) {
  // Text and numbers commit on Enter or when the field loses focus (one rerun per edit, not per keystroke).
  const [draft, setDraft] = useState<string | null>(null);
  const shown = draft ?? (value === null || value === undefined ? "" : String(value));
  const commit = () => {
    if (draft === null) return;
    const v = spec.kind === "number" ? Number(draft) : draft;
    setDraft(null);
    if (spec.kind === "number" && !Number.isFinite(v as number)) return;
    if (v !== value) onCommit(v);
  };
  if (spec.kind === "checkbox") {
    return (
      <label className="field check nodrag">
        <input id={spec.name} name={spec.name} type="checkbox" checked={value === true}
               onChange={(e) => onCommit(e.target.checked)} />
        {spec.name}
      </label>
    );
  }
  if (spec.kind === "select") {
    return (
      <label className="field nodrag">
        <span>{spec.name}</span>
        <select id={spec.name} name={spec.name} value={String(value ?? spec.default)} onChange={(e) => onCommit(e.target.value)}>
          {(spec.items ?? []).map((item) => <option key={item} value={item}>{item}</option>)}
        </select>
      </label>
    );
  }
  return (
    <label className="field nodrag">
      <span>{spec.name}</span>
      <input id={spec.name} name={spec.name} type={spec.kind === "number" ? "number" : "text"} value={shown}
             placeholder={placeholder} step="any"
             onChange={(e) => setDraft(e.target.value)} onBlur={commit}
             onKeyDown={(e) => { if (e.key === "Enter") { commit(); (e.target as HTMLInputElement).blur(); } }} />
    </label>
  );
}

function CellNode({ id, data, selected }: NodeProps<CellNodeType>) {
  // Ports with a wire are drawn filled ("wired"), the others hollow: a missing wire shows at a glance.
  const wired = new Set(useNodeConnections({ handleType: "target" }).map((c) => c.targetHandle));
  const [name, op] = data.label.includes(" · ") ? data.label.split(" · ", 2) : [data.label, ""];
  const values = Object.fromEntries(data.options.map((o) => [o.name, o.value]));
  const named = data.outputs.length > 1;       // outputs drawn as rows with their names, not in the header
  return (
    <div className={`cell-node kind-${data.blockType.replace(/\W/g, "-")}${data.mark ? " marked" : ""}${selected ? " selected" : ""}`}
         title={data.mark ? `${data.mark}` : data.description}>
      <div className="header">
        <span className="label">{data.mark ? WARNING : ""}{name}{op ? <span className="op"> · {op}</span> : null}</span>
        {named ? null : data.outputs.map((p) => <Handle key={p.name} type="source" position={Position.Right} id={p.name} />)}
      </div>
      {data.inputs.map((p) => (
        <div className="port" key={p.name}>
          <Handle type="target" position={Position.Left} id={p.name} className={wired.has(p.name) ? "wired" : "open"} />
          <span>{p.name}</span>
        </div>
      ))}
      {named ? data.outputs.map((p) => (
        <div className="port output" key={`output-${p.name}`}>
          <span>{p.name}</span>
          <Handle type="source" position={Position.Right} id={p.name} />
        </div>
      )) : null}
      {data.mark ? <div className="mark">{data.mark}</div> : null}
      {selected && data.specs.length > 0 ? (
        <div className="fields">
          {data.specs.map((spec) => (
            <Field key={spec.name} spec={spec} placeholder={spec.name === "name" ? data.label.replace(/\W+/g, "_") : ""} value={spec.name in values ? values[spec.name] : spec.default}
                   onCommit={(v) => data.onOption(id, spec.name, v)} />
          ))}
        </div>
      ) : null}
    </div>
  );
}

export default memo(CellNode);
