// The start form: choosing another algorithm shows that algorithm's fields (the page
// for ?algorithm=...). Without this script, the form does the same when submitted.
(function () {
  "use strict";
  var select = document.getElementById("id_algorithm");
  if (!select) { return; }
  select.addEventListener("change", function () {
    var url = new URL(window.location.href);
    url.searchParams.set("algorithm", select.value);
    window.location.assign(url.toString());
  });
})();
