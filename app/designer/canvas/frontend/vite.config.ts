import { defineConfig } from "vite";
import react from "@vitejs/plugin-react";

// Streamlit serves the built files from ../static under a path of its own: relative asset URLs.
export default defineConfig({
  plugins: [react()],
  base: "./",
  build: { outDir: "../static", emptyOutDir: true, chunkSizeWarningLimit: 1000 },
});
