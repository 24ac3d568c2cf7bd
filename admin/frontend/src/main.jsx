// Entry point: reads the page's JSON blob (admin/templates/admin/followup/builder.html) and mounts
// the builder. The blob holds the flow, the JSON Schema, the org's templates, the org's fields,
// the endpoints and every word to show, already in the reader's language.
import { createRoot } from 'react-dom/client';
import { ReactFlowProvider } from '@xyflow/react';
import '@xyflow/react/dist/style.css';
import './builder.css';
import { App } from './App.jsx';

function start() {
  const root = document.getElementById('lembra-builder');
  const blob = document.getElementById('lembra-builder-boot');
  if (!root || !blob) return;
  const boot = JSON.parse(blob.textContent);
  createRoot(root).render(
    <ReactFlowProvider>
      <App boot={boot} />
    </ReactFlowProvider>,
  );
}

if (document.readyState === 'loading') {
  document.addEventListener('DOMContentLoaded', start);
} else {
  start();
}
