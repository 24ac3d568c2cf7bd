/* The desk's live pages (Conversas, a conversation, the sandbox chat), with htmx polling a
 * fragment endpoint (hx-get + hx-trigger="every …"). Static on purpose: the Content-Security-Policy
 * (admin/security.py) allows no inline script.
 *
 * - A thread (#lembra-thread) opens at its newest message and, when new messages arrive, stays at
 *   the bottom if the reader was there; a reader scrolled up to read older messages is left alone.
 * - A poll whose answer is the same as what is shown swaps nothing (no flicker, no lost selection).
 * - The Conversas list is not swapped while rows are ticked for "Marcar selecionadas como
 *   resolvidas", so a poll never unticks them.
 * - #lembra-compose in the address (after "Assumir a conversa") focuses the composer.
 */
(function () {
  'use strict';
  var SLACK = 40; // px from the bottom that still count as "at the bottom"

  function atBottom(el) { return el.scrollHeight - el.scrollTop - el.clientHeight <= SLACK; }
  function toBottom(el) { el.scrollTop = el.scrollHeight; }
  function threadOf(el) { return el && el.id === 'lembra-thread' ? el : null; }

  document.addEventListener('DOMContentLoaded', function () {
    var thread = document.getElementById('lembra-thread');
    if (thread) { toBottom(thread); }
    if (window.location.hash === '#lembra-compose') {
      var box = document.getElementById('lembra-compose');
      if (box) {
        box.scrollIntoView({block: 'center'});
        var field = box.querySelector('textarea, button[type=submit]');
        if (field) { field.focus(); }
      }
    }
  });

  document.addEventListener('htmx:beforeSwap', function (event) {
    var target = event.detail.target;
    var shown = target.getAttribute('data-lembra-shown');
    if (shown !== null && shown === event.detail.serverResponse) {
      event.detail.shouldSwap = false;
      return;
    }
    if (target.querySelector('input[type=checkbox]:checked')) {
      event.detail.shouldSwap = false; // keep the reader's selection; the next poll shows the news
      return;
    }
    var thread = threadOf(target);
    if (thread) { thread.setAttribute('data-lembra-follow', atBottom(thread) ? '1' : '0'); }
  });

  document.addEventListener('htmx:afterSwap', function (event) {
    var target = event.detail.target;
    target.setAttribute('data-lembra-shown', event.detail.xhr.responseText);
    var thread = threadOf(target);
    if (thread && thread.getAttribute('data-lembra-follow') === '1') { toBottom(thread); }
  });
})();
