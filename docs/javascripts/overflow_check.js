// Used by scripts/docs_screenshots.py only: with ?overflow-check in the URL, record on <body>
// which code blocks and tables are wider than the content column (cut off on screen).
if (window.location.search.indexOf("overflow-check") >= 0) {
  window.addEventListener("load", function () {
    var wide = [];
    document.querySelectorAll(".md-content pre > code, .md-content .md-typeset__table table")
      .forEach(function (element) {
        var box = element.closest("pre") || element.parentElement;
        if (element.scrollWidth > box.clientWidth + 1) {
          wide.push(element.tagName + ":" + element.textContent.slice(0, 60).replace(/\s+/g, " "));
        }
      });
    document.body.setAttribute("data-overflow", JSON.stringify(wide));
  });
}
