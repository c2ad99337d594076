// The editor schema: barfi's FlowSchema export form, which app/designer/adapter.py reads and writes.
export type Port = { name: string; itype?: string };
export type OptionValue = string | number | boolean | null;
export type Option = { name: string; value: OptionValue };
export type RawNode = {
  id: string;
  type: string;
  name?: string;
  label: string;
  inputs: Port[];
  outputs: Port[];
  options: Option[];
  position: { x: number; y: number };
  measured?: { width: number; height: number };
};
export type RawConnection = {
  id: string;
  outputNode: string;
  outputNodeInterface: string;
  inputNode: string;
  inputNodeInterface: string;
};
export type Schema = {
  version?: string;
  nodes: RawNode[];
  connections: RawConnection[];
  viewport?: { x: number; y: number; zoom: number };
};

// The palette (app/designer/palette.py SPECS, by category).
export type OptionSpec = { name: string; kind: "input" | "select" | "number" | "checkbox"; default: OptionValue; items?: string[] };
export type BlockSpec = { type: string; inputs: string[]; outputs: string[]; options: OptionSpec[]; description: string };
export type Category = { name: string; blocks: BlockSpec[] };

// What the Python side passes on every run.
export type CanvasArgs = {
  schema: Schema;            // the graph to draw when `revision` is new
  revision: number;          // changes when the app draws a graph afresh (preset, undo, redraw)
  palette: Category[];
  marks: Record<string, string>;   // node id -> what is wrong there
  height: number;
};
