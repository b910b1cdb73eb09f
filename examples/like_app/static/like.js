// Progressive enhancement: without this script every Like button still works
// (its form posts and the page reloads). With it, the like is sent with
// fetch() to the JSON endpoint and only the count changes.
"use strict";

const status = document.getElementById("status");

function unit(likes) {
  return likes === 1 ? "like" : "likes";
}

function show(item, likes) {
  const count = document.getElementById(`likes-${item}`);
  // Answers to quick clicks can arrive out of order; a total only grows,
  // so the largest one seen is the newest.
  const shown = Math.max(Number(count.dataset.count), likes);
  count.dataset.count = String(shown);
  count.textContent = String(shown);
  count.nextElementSibling.textContent = unit(shown);
  return shown;
}

document.addEventListener("submit", async (event) => {
  const form = event.target.closest("form[data-api]");
  if (!form) return;
  event.preventDefault();
  const item = form.dataset.item;
  const button = form.querySelector("button");
  button.setAttribute("aria-busy", "true");
  try {
    const response = await fetch(form.dataset.api, {
      method: "POST",
      headers: { Accept: "application/json" },
    }).catch(() => {
      throw new Error("No answer from the server: reload the page to see whether your like counted.");
    });
    const body = await response.json().catch(() => ({}));
    // A refusal's detail says whether the like was counted.
    if (!response.ok) throw new Error(body.detail || `The server answered ${response.status}.`);
    if (body.likes === null) {
      status.textContent = body.detail;  // counted, but the new total could not be read
    } else {
      const label = document.getElementById(`label-${item}`).textContent;
      const shown = show(item, body.likes);
      status.textContent = `${label}: ${shown} ${unit(shown)}`;
    }
  } catch (error) {
    status.textContent = error.message;
  } finally {
    button.removeAttribute("aria-busy");
  }
});
