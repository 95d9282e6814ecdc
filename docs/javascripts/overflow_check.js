// Used by scripts/docs_screenshots.py only: with ?overflow-check in the URL, record on <body>
// which code blocks and tables are wider than the content column (cut off on screen), how many
// characters of code a line of the column holds (data-code-columns) and the page's height in px
// (data-height).
if (window.location.search.indexOf("overflow-check") >= 0) {
  window.addEventListener("load", function () {
    var wide = [];
    document.querySelectorAll(".md-content pre > code, .md-content .md-typeset__table table")
      .forEach(function (element) {
        var box = element.closest("pre") || element.parentElement;
        if (box.clientWidth === 0) {
          return;  // not laid out (a closed <details>): measured by the probe below instead
        }
        if (element.scrollWidth > box.clientWidth + 1) {
          wide.push(element.tagName + ":" + element.textContent.slice(0, 60).replace(/\s+/g, " "));
        }
      });
    document.body.setAttribute("data-overflow", JSON.stringify(wide));
    document.body.setAttribute("data-height", String(document.documentElement.scrollHeight));
    // a probe block of 200 characters, laid out like every code block of the page
    var typeset = document.querySelector(".md-content .md-typeset");
    if (typeset) {
      var pre = document.createElement("pre");
      var code = document.createElement("code");
      code.textContent = new Array(201).join("0");
      pre.appendChild(code);
      typeset.appendChild(pre);
      var perChar = code.scrollWidth / 200;
      var style = window.getComputedStyle(code);
      var inner = code.clientWidth - parseFloat(style.paddingLeft) - parseFloat(style.paddingRight);
      document.body.setAttribute("data-code-columns", String(Math.floor(inner / perChar)));
      typeset.removeChild(pre);
    }
  });
}
