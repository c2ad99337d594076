// The Streamlit component protocol (components.v1): a few postMessage calls between this iframe and the app.
// Written here rather than imported from streamlit-component-lib, which would bundle Apache Arrow for nothing.

export type Args = Record<string, unknown>;

function send(type: string, data: Record<string, unknown>): void {
  window.parent.postMessage({ isStreamlitMessage: true, type, ...data }, "*");
}

/** Calls `onRender` with the component's arguments on every run of the app's script that draws it. */
export function connect(onRender: (args: Args) => void): void {
  window.addEventListener("message", (event: MessageEvent) => {
    const data = event.data;
    if (data && data.type === "streamlit:render") onRender((data.args ?? {}) as Args);
  });
  send("streamlit:componentReady", { apiVersion: 1 });
}

/** The component's value, as JSON: the app's script reruns and reads it. */
export function setComponentValue(value: unknown): void {
  send("streamlit:setComponentValue", { value, dataType: "json" });
}

export function setFrameHeight(height: number): void {
  send("streamlit:setFrameHeight", { height });
}
