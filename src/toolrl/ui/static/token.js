// The page a link opens without the UI's access token: it asks for the token (or the whole URL `toolrl ui`
// printed) and then opens the link's view, kept in its #hash, which never reaches the server.
"use strict";

document.getElementById("token-wrong").hidden = !new URLSearchParams(location.search).has("token");
const view = location.hash.slice(1).split("?")[0];
document.getElementById("token-view").textContent = view ? `Then: the ${view} view this link shows.` : "";
document.getElementById("token-form").addEventListener("submit", (event) => {
  event.preventDefault();
  const given = document.getElementById("token-value").value.trim();
  let token = given;
  try {
    token = new URL(given).searchParams.get("token") || given;
  } catch {
    // not a URL: the token itself
  }
  location.href = `${location.pathname}?token=${encodeURIComponent(token)}${location.hash}`;
});
