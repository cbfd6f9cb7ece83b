package admin

import (
	"fmt"
	"html"
	"maps"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/munnerz/goautoneg"
)

// kube-proxy's /flagz and /statusz (component-base's "zpages", served
// behind its ComponentFlagz and ComponentStatusz gates): pages for people
// debugging a node, in plain text, whose field delimiter is picked at random
// so that no script comes to depend on them. Each is answered as kube-proxy
// v1.34 answers it: only to a request that accepts text/plain, else 406.

// zpageComponent is the component the pages name, as kube-proxy's do.
const zpageComponent = "kube-proxy"

// zpageDelimiters are the field delimiters a page picks from.
var zpageDelimiters = [...]string{":", ": ", "=", " "}

// zpageWarning follows each page's title line.
const zpageWarning = "Warning: This endpoint is not meant to be machine parseable, has no formatting compatibility guarantees and is for debugging purposes only."

// Statusz is what /statusz shows of the process.
type Statusz struct {
	Started time.Time
	// GoVersion, BinaryVersion and EmulationVersion are shown as given
	// (EmulationVersion "": no such line).
	GoVersion, BinaryVersion, EmulationVersion string
	// Now is the clock for the uptime (nil: time.Now).
	Now func() time.Time
}

// acceptsPlainText reports whether r's Accept header takes text/plain
// (text/*, */*), with no parameter but charset=utf-8, as kube-proxy's
// zpages require. No Accept header takes nothing.
func acceptsPlainText(r *http.Request) bool {
	for _, a := range goautoneg.ParseAccept(r.Header.Get("Accept")) {
		if (a.Type != "text" && a.Type != "*") || (a.SubType != "plain" && a.SubType != "*") {
			continue
		}
		if cs, ok := a.Params["charset"]; len(a.Params) == 0 || len(a.Params) == 1 && ok && strings.EqualFold(cs, "utf-8") {
			return true
		}
	}
	return false
}

// notAcceptable answers a request for a zpage that does not take text/plain.
func notAcceptable(w http.ResponseWriter) {
	http.Error(w, "media type not acceptable, must be: text/plain", http.StatusNotAcceptable)
}

// flagzHandler serves /flagz: every flag and its value, sorted by name.
// The page is made at the first request, with one delimiter for the
// process's life, as kube-proxy's is.
func flagzHandler(flags map[string]string) http.HandlerFunc {
	var once sync.Once
	var page []byte
	return func(w http.ResponseWriter, r *http.Request) {
		if !acceptsPlainText(r) {
			notAcceptable(w)
			return
		}
		once.Do(func() {
			var b strings.Builder
			fmt.Fprintf(&b, "\n%s flags\n%s\n\n", zpageComponent, zpageWarning)
			delim := zpageDelimiters[rand.IntN(len(zpageDelimiters))]
			for _, name := range slices.Sorted(maps.Keys(flags)) {
				fmt.Fprintf(&b, "%s%s%s\n", name, delim, flags[name])
			}
			page = []byte(b.String())
		})
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Write(page)
	}
}

// statuszHandler serves /statusz: when the process started, how long it
// has been up, and its Go, binary and emulation versions, with a
// delimiter picked per request.
func statuszHandler(s *Statusz) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if !acceptsPlainText(r) {
			notAcceptable(w)
			return
		}
		now := time.Now
		if s.Now != nil {
			now = s.Now
		}
		d := html.EscapeString(zpageDelimiters[rand.IntN(len(zpageDelimiters))])
		up := int64(now().Sub(s.Started).Seconds())
		emulation := ""
		if s.EmulationVersion != "" {
			emulation = fmt.Sprintf("Emulation version%s %s", d, html.EscapeString(s.EmulationVersion))
		}
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		fmt.Fprintf(w, "\n%s statusz\n%s\n", zpageComponent, zpageWarning)
		fmt.Fprintf(w, "\nStarted%[1]s %[2]s\nUp%[1]s %[3]s\nGo version%[1]s %[4]s\nBinary version%[1]s %[5]s\n%[6]s\n\n",
			d, html.EscapeString(s.Started.Format(time.UnixDate)),
			fmt.Sprintf("%d hr %02d min %02d sec", up/3600, (up/60)%60, up%60),
			html.EscapeString(s.GoVersion), html.EscapeString(s.BinaryVersion), emulation)
	}
}
