// oidc-issuer: a real OIDC issuer for the haltsql tests.
//
// It runs github.com/oauth2-proxy/mockoidc over HTTPS (discovery, JWKS,
// authorize, token) and a plain-HTTP control listener on loopback that
// mints ID tokens by walking the real authorization-code flow against the
// issuer, and rotates the signing key:
//
//	GET  /token?sub=S&policy=P[&shift=-2h]  -> the id_token (text); shift moves the issuer's clock for this token
//	POST /rotate                            -> a new RSA signing key (new kid)
//
// On start it prints one JSON line to stdout:
// {"issuer": "...", "client_id": "...", "control": "http://127.0.0.1:N"}.
package main

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/oauth2-proxy/mockoidc"
)

// user is a mockoidc user with the policy claim haltsql maps to a policy.
type user struct {
	sub    string
	policy string
}

func (u *user) ID() string { return u.sub }

func (u *user) Userinfo([]string) ([]byte, error) {
	return json.Marshal(map[string]string{"sub": u.sub})
}

type claims struct {
	*mockoidc.IDTokenClaims
	Policy string `json:"haltsql_policy,omitempty"`
}

func (u *user) Claims(_ []string, c *mockoidc.IDTokenClaims) (jwt.Claims, error) {
	return &claims{IDTokenClaims: c, Policy: u.policy}, nil
}

func main() {
	certFile := flag.String("cert", "", "PEM certificate of the issuer")
	keyFile := flag.String("key", "", "PEM private key of the issuer")
	caFile := flag.String("ca", "", "PEM CA that signed -cert (the token flow trusts it)")
	listen := flag.String("listen", "127.0.0.1:0", "HTTPS address of the issuer")
	clientID := flag.String("client-id", "haltsql-tests", "the client id (the tokens' audience)")
	flag.Parse()

	cert, err := tls.LoadX509KeyPair(*certFile, *keyFile)
	if err != nil {
		log.Fatalf("issuer certificate: %v", err)
	}
	caPEM, err := os.ReadFile(*caFile)
	if err != nil {
		log.Fatalf("CA: %v", err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(caPEM) {
		log.Fatalf("CA %s holds no certificate", *caFile)
	}

	m, err := mockoidc.NewServer(nil)
	if err != nil {
		log.Fatal(err)
	}
	m.ClientID = *clientID
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		log.Fatal(err)
	}
	// mockoidc serves the listener it gets as is: hand it a TLS one.
	tlsConfig := &tls.Config{Certificates: []tls.Certificate{cert}}
	if err := m.Start(tls.NewListener(ln, tlsConfig), tlsConfig); err != nil {
		log.Fatal(err)
	}

	client := &http.Client{
		Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots}},
		CheckRedirect: func(*http.Request, []*http.Request) error {
			return http.ErrUseLastResponse
		},
		Timeout: 10 * time.Second,
	}
	var mu sync.Mutex
	ctl := http.NewServeMux()
	ctl.HandleFunc("/token", func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		q := r.URL.Query()
		shift := time.Duration(0)
		if s := q.Get("shift"); s != "" {
			if shift, err = time.ParseDuration(s); err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
		}
		m.FastForward(shift)
		defer m.FastForward(-shift)
		m.QueueUser(&user{sub: q.Get("sub"), policy: q.Get("policy")})
		token, err := flow(client, m)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		fmt.Fprint(w, token)
	})
	ctl.HandleFunc("/rotate", func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			http.Error(w, "POST", http.StatusMethodNotAllowed)
			return
		}
		mu.Lock()
		defer mu.Unlock()
		kp, err := mockoidc.RandomKeypair(2048)
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		m.Keypair = kp
		kid, _ := kp.KeyID()
		fmt.Fprint(w, kid)
	})
	ctlLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	go func() { log.Fatal(http.Serve(ctlLn, ctl)) }()

	line, _ := json.Marshal(map[string]string{
		"issuer":    m.Issuer(),
		"client_id": m.ClientID,
		"control":   "http://" + ctlLn.Addr().String(),
	})
	fmt.Println(string(line))
	select {}
}

// flow walks the authorization-code flow and returns the ID token.
func flow(c *http.Client, m *mockoidc.MockOIDC) (string, error) {
	redirect := "http://127.0.0.1/callback"
	q := url.Values{
		"scope":         {"openid"},
		"state":         {"s"},
		"nonce":         {"n"},
		"client_id":     {m.ClientID},
		"response_type": {"code"},
		"redirect_uri":  {redirect},
	}
	resp, err := c.Get(m.AuthorizationEndpoint() + "?" + q.Encode())
	if err != nil {
		return "", err
	}
	resp.Body.Close()
	loc, err := url.Parse(resp.Header.Get("Location"))
	if err != nil || loc.Query().Get("code") == "" {
		return "", fmt.Errorf("authorize answered %s without a code", resp.Status)
	}
	form := url.Values{
		"client_id":     {m.ClientID},
		"client_secret": {m.ClientSecret},
		"code":          {loc.Query().Get("code")},
		"grant_type":    {"authorization_code"},
		"redirect_uri":  {redirect},
	}
	resp, err = c.Post(m.TokenEndpoint(), "application/x-www-form-urlencoded", strings.NewReader(form.Encode()))
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", err
	}
	var tr struct {
		IDToken string `json:"id_token"`
	}
	if err := json.Unmarshal(body, &tr); err != nil || tr.IDToken == "" {
		return "", fmt.Errorf("token endpoint answered %s: %s", resp.Status, body)
	}
	return tr.IDToken, nil
}
