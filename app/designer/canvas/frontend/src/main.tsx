import { StrictMode, useEffect, useState } from "react";
import { createRoot } from "react-dom/client";
import { ReactFlowProvider } from "@xyflow/react";
import "@xyflow/react/dist/style.css";
import "./styles.css";
import Canvas from "./Canvas";
import { connect, setFrameHeight } from "./streamlit";
import type { CanvasArgs } from "./types";

function App() {
  const [args, setArgs] = useState<CanvasArgs | null>(null);
  useEffect(() => connect((a) => setArgs(a as unknown as CanvasArgs)), []);
  useEffect(() => { if (args) setFrameHeight(args.height + 24); }, [args?.height]);
  if (!args) return null;
  return (
    <ReactFlowProvider>
      <Canvas args={args} />
    </ReactFlowProvider>
  );
}

createRoot(document.getElementById("root")!).render(<StrictMode><App /></StrictMode>);
