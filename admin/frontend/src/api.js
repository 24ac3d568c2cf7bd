// The console's JSON endpoints (admin/views/followup/builder.py), with the session cookie and the
// CSRF token of the page's <meta name="csrf-token"> (the app's CSRFProtect checks every POST).

export class RequestFailed extends Error {
  constructor(status, body) {
    super((body && body.error) || String(status));
    this.status = status;
    this.body = body || {};
  }
}

function csrfToken() {
  const meta = document.querySelector('meta[name="csrf-token"]');
  return meta ? meta.getAttribute('content') : '';
}

async function call(method, url, body) {
  const headers = { Accept: 'application/json' };
  const init = { method, headers, credentials: 'same-origin' };
  if (method !== 'GET') {
    headers['Content-Type'] = 'application/json';
    headers['X-CSRFToken'] = csrfToken();
    init.body = JSON.stringify(body || {});
  }
  const response = await fetch(url, init);
  let data = null;
  try {
    data = await response.json();
  } catch (error) {
    data = null;
  }
  if (!response.ok) throw new RequestFailed(response.status, data);
  return data;
}

export const getJSON = (url) => call('GET', url);
export const postJSON = (url, body) => call('POST', url, body);
