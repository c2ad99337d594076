// The Designer's canvas: React Flow with the cell's blocks, a right-click palette, zoom, fit view and a minimap.
// Every edit (a wire drawn or deleted, a block added, moved or deleted, a field changed) goes back to the app at once
// as an editor schema (a move only so that the app keeps the blocks' places when it draws the graph again); the app validates it and sends back marks for the blocks at fault, which this draws in place.
import { useCallback, useEffect, useMemo, useRef, useState } from "react";
import {
  ReactFlow, Background, Controls, MiniMap, useReactFlow, addEdge, applyEdgeChanges, applyNodeChanges,
  type Connection, type Edge, type EdgeChange, type FinalConnectionState, type FitViewOptions, type NodeChange,
} from "@xyflow/react";
import CellNode, { type CellNodeData, type CellNodeType } from "./CellNode";
import { setComponentValue } from "./streamlit";
import type { BlockSpec, CanvasArgs, Category, OptionValue, RawNode, Schema } from "./types";

const nodeTypes = { cell: CellNode };
// Fit view leaves the minimap (bottom right) and the zoom buttons (bottom left) their own margins, and keeps every
// block's ports out of the 40 px band along the edges where a wire being drawn pans the canvas (React Flow's
// autoPanOnConnect): a top row 8 px from the edge slid away under a person wiring to it.
const FIT: FitViewOptions = { padding: { top: "44px", right: "156px", bottom: "44px", left: "44px" }, maxZoom: 1.2 };

type Menu = { x: number; y: number; flow: { x: number; y: number }; category: string | null };

function specOf(palette: Category[], type: string): BlockSpec | undefined {
  for (const c of palette) for (const b of c.blocks) if (b.type === type) return b;
  return undefined;
}

function toEdge(c: Schema["connections"][number]): Edge {
  return { id: c.id, source: c.outputNode, sourceHandle: c.outputNodeInterface, target: c.inputNode,
           targetHandle: c.inputNodeInterface };
}

export default function Canvas({ args }: { args: CanvasArgs }) {
  const flow = useReactFlow();
  const [nodes, setNodes] = useState<CellNodeType[]>([]);
  const [edges, setEdges] = useState<Edge[]>([]);
  const [menu, setMenu] = useState<Menu | null>(null);
  const revision = useRef<number | null>(null);
  const edit = useRef(0);
  const pending = useRef(false);
  const paletteRef = useRef(args.palette);
  paletteRef.current = args.palette;

  const onOption = useCallback((id: string, name: string, value: OptionValue) => {
    setNodes((ns) => ns.map((n) => n.id !== id ? n : {
      ...n, data: { ...n.data, options: [...n.data.options.filter((o) => o.name !== name), { name, value }] } }));
    pending.current = true;
  }, []);

  const toNode = useCallback((raw: RawNode): CellNodeType => {
    const spec = specOf(paletteRef.current, raw.type);
    const data: CellNodeData = {
      label: raw.label, blockType: raw.type, inputs: raw.inputs ?? [], outputs: raw.outputs ?? [],
      options: raw.options ?? [], specs: spec?.options ?? [], description: spec?.description ?? "", onOption,
    };
    return { id: raw.id, type: "cell", position: raw.position ?? { x: 0, y: 0 }, data };
  }, [onOption]);

  // A new revision: the app drew a graph afresh (a preset, undo, a redraw). Anything else keeps the canvas as is.
  useEffect(() => {
    if (revision.current === args.revision) return;
    revision.current = args.revision;
    edit.current = 0;
    setNodes((args.schema.nodes ?? []).map(toNode));
    setEdges((args.schema.connections ?? []).map(toEdge));
    setMenu(null);
    window.requestAnimationFrame(() => flow.fitView(FIT));
  }, [args.revision, args.schema, toNode, flow]);

  // The app's verdict on the last edit: marks on the blocks at fault, drawn without touching anything else.
  useEffect(() => {
    setNodes((ns) => ns.map((n) => {
      const mark = args.marks?.[n.id];
      return mark === n.data.mark ? n : { ...n, data: { ...n.data, mark } };
    }));
  }, [args.marks, nodes.length]);

  // Send after the state an edit produced is in place.
  useEffect(() => {
    if (!pending.current) return;
    pending.current = false;
    edit.current += 1;
    const schema: Schema = {
      version: "1.0",
      nodes: nodes.map((n) => ({
        id: n.id, type: n.data.blockType, name: n.data.blockType, label: n.data.label,
        inputs: n.data.inputs, outputs: n.data.outputs, options: n.data.options,
        position: { x: n.position.x, y: n.position.y },
        measured: { width: n.measured?.width ?? 0, height: n.measured?.height ?? 0 },
      })),
      connections: edges.map((e) => ({
        id: e.id, outputNode: e.source, outputNodeInterface: e.sourceHandle ?? "value", inputNode: e.target,
        inputNodeInterface: e.targetHandle ?? "",
      })),
      viewport: flow.getViewport(),
    };
    setComponentValue({ revision: revision.current, edit: edit.current, schema });
  }, [nodes, edges, flow]);

  // Ctrl+Z / Ctrl+Shift+Z / Ctrl+Y (Cmd on a Mac): the app's undo and redo (its history holds every edit).
  useEffect(() => {
    const onKey = (e: KeyboardEvent) => {
      const target = e.target as HTMLElement | null;
      if (target && ["INPUT", "SELECT", "TEXTAREA"].includes(target.tagName)) return;   // the field's own undo
      if (!(e.ctrlKey || e.metaKey)) return;
      const key = e.key.toLowerCase();
      const command = key === "z" ? (e.shiftKey ? "redo" : "undo") : key === "y" ? "redo" : null;
      if (!command) return;
      e.preventDefault();
      edit.current += 1;
      setComponentValue({ revision: revision.current, edit: edit.current, command });
    };
    window.addEventListener("keydown", onKey);
    return () => window.removeEventListener("keydown", onKey);
  }, []);

  const onNodesChange = useCallback((changes: NodeChange<CellNodeType>[]) => {
    if (changes.some((c) => c.type === "remove")) pending.current = true;
    setNodes((ns) => applyNodeChanges(changes, ns));
  }, []);
  const onEdgesChange = useCallback((changes: EdgeChange[]) => {
    if (changes.some((c) => c.type === "remove")) pending.current = true;
    setEdges((es) => applyEdgeChanges(changes, es));
  }, []);
  // A wire dropped on the block it starts from makes no edge here: tell the app, which says why in words (a value
  // cannot be computed from itself within one step) instead of the wire vanishing without one.
  const onConnectEnd = useCallback((event: MouseEvent | TouchEvent, state: FinalConnectionState) => {
    const from = state.fromNode?.id;
    if (!from || state.isValid) return;
    const handle = event.target instanceof Element ? event.target.closest(".react-flow__handle.target") : null;
    const onTarget = state.toHandle?.type === "target";
    const dropped = onTarget ? state.toNode?.id : handle?.closest(".react-flow__node")?.getAttribute("data-id");
    if (dropped !== from) return;
    const port = onTarget ? state.toHandle?.id : handle?.getAttribute("data-handleid");
    edit.current += 1;
    setComponentValue({ revision: revision.current, edit: edit.current, refused: { block: from, port: port ?? "" } });
  }, []);
  const onConnect = useCallback((c: Connection) => {
    if (c.source === c.target) {           // the same: said in words by the app, never drawn
      edit.current += 1;
      setComponentValue({ revision: revision.current, edit: edit.current, refused: { block: c.source, port: c.targetHandle ?? "" } });
      return;
    }
    pending.current = true;
    const id = `edge__${Date.now().toString(36)}${Math.random().toString(36).slice(2, 7)}`;
    setEdges((es) => addEdge({ ...c, id }, es));
  }, []);

  const addBlock = useCallback((spec: BlockSpec, at: { x: number; y: number }) => {
    setMenu(null);
    pending.current = true;
    setNodes((ns) => {
      const count = ns.filter((n) => n.data.blockType === spec.type).length;
      const raw: RawNode = {
        id: `node__${Date.now().toString(36)}${Math.random().toString(36).slice(2, 7)}`,
        type: spec.type, label: `${spec.type}-${count + 1}`,
        inputs: spec.inputs.map((name) => ({ name })), outputs: spec.outputs.map((name) => ({ name })),
        options: spec.options.map((o) => ({ name: o.name, value: o.default })), position: at,
      };
      return [...ns.map((n) => ({ ...n, selected: false })), { ...toNode(raw), selected: true }];
    });
  }, [toNode]);

  const onPaneContextMenu = useCallback((event: MouseEvent | React.MouseEvent) => {
    event.preventDefault();
    const flowAt = flow.screenToFlowPosition({ x: event.clientX, y: event.clientY });
    setMenu({ x: event.clientX, y: event.clientY, flow: flowAt, category: null });
  }, [flow]);

  const menuView = useMemo(() => {
    if (!menu) return null;
    const category = args.palette.find((c) => c.name === menu.category);
    const upward = menu.y > window.innerHeight / 2;     // open towards the middle: the iframe clips the rest
    return (
      <div className={`menu${upward ? " upward" : ""}`} role="menu" onContextMenu={(e) => e.preventDefault()}
           style={upward ? { left: menu.x, bottom: window.innerHeight - menu.y } : { left: menu.x, top: menu.y }}>
        {args.palette.map((c) => (
          <div key={c.name} role="menuitem" tabIndex={-1} aria-haspopup="menu" aria-label={c.name}
               className={`item${menu.category === c.name ? " open" : ""}`}
               onMouseEnter={() => setMenu({ ...menu, category: c.name })}
               onClick={() => setMenu({ ...menu, category: c.name })}>
            {c.name}
          </div>
        ))}
        {category ? (
          <div className="submenu" role="menu">
            {category.blocks.map((b) => (
              <div key={b.type} role="menuitem" tabIndex={-1} className="item" title={b.description} aria-label={b.type}
                   onClick={() => addBlock(b, menu.flow)}>
                {b.type}
              </div>
            ))}
          </div>
        ) : null}
      </div>
    );
  }, [menu, args.palette, addBlock]);

  return (
    <div className="canvas" style={{ height: args.height }}
         onKeyDown={(e) => { if (e.key === "Escape") setMenu(null); }}>
      <ReactFlow<CellNodeType, Edge>
        nodes={nodes} edges={edges} nodeTypes={nodeTypes}
        onNodesChange={onNodesChange} onEdgesChange={onEdgesChange} onConnect={onConnect} onConnectEnd={onConnectEnd}
        onPaneContextMenu={onPaneContextMenu} onPaneClick={() => setMenu(null)} onNodeClick={() => setMenu(null)}
        onNodeDragStop={() => { pending.current = true; setNodes((ns) => [...ns]); }}
        deleteKeyCode={["Backspace", "Delete"]} minZoom={0.05} maxZoom={2.5} fitView
        fitViewOptions={FIT} proOptions={{ hideAttribution: true }}>
        <Background gap={24} size={1} />
        <Controls fitViewOptions={FIT} />
        <MiniMap pannable zoomable nodeStrokeWidth={3} style={{ width: 140, height: 96 }}
                 nodeColor={(n) => ((n.data as CellNodeData).mark ? "#d9480f" : "#868e96")} />
      </ReactFlow>
      <div className="hint">
        right-click: add a block · drag from a dot to a port: a wire · select + Backspace: delete · Ctrl+Z / Ctrl+Y: undo / redo
      </div>
      {menuView}
    </div>
  );
}
