// Command netstack-proxy is wireproxy's engine for `cargo xtask bench-proxy`: wireguard-go's
// device and gVisor's TCP/IP stack in this process (tun/netstack, as wireproxy uses them),
// no TUN and no root, behind an HTTP proxy served by Go's net/http that answers CONNECT by
// dialing through the netstack and splicing the two connections, as wireproxy's HTTP mode
// does. wireproxy itself is not served by the module proxy here; this is its data path, not
// its feature set (no SOCKS5, no plain-HTTP forwarding, no config file).
//
//	netstack-proxy --address 10.77.0.1 --allowed-ip 10.77.0.2/32 --private-key-file KEY \
//	    --peer-public-key BASE64 --endpoint 192.0.2.2:51820 [--mtu 1420] --http 127.0.0.1:18080
//
// It runs until SIGTERM or SIGINT. Once its listener is open it prints "listening on ADDR" on
// stderr; a failure to start is one line on stderr and exit status 1.
package main

import (
	"context"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.zx2c4.com/wireguard/conn"
	"golang.zx2c4.com/wireguard/device"
	"golang.zx2c4.com/wireguard/tun/netstack"
)

// Longest a dial through the tunnel (with the first handshake) may take.
const dialTimeout = 10 * time.Second

func main() {
	if err := run(); err != nil {
		fmt.Fprintf(os.Stderr, "netstack-proxy: %v\n", err)
		os.Exit(1)
	}
}

func run() error {
	address := flag.String("address", "", "this side's tunnel address")
	allowed := flag.String("allowed-ip", "", "the peer's allowed IPs, one prefix")
	keyFile := flag.String("private-key-file", "", "this side's private key, base64")
	peerKey := flag.String("peer-public-key", "", "the peer's public key, base64")
	endpoint := flag.String("endpoint", "", "the peer's WireGuard endpoint, IP:port")
	mtu := flag.Int("mtu", 1420, "the tunnel MTU")
	listen := flag.String("http", "", "where the HTTP proxy listens, IP:port")
	flag.Parse()
	if flag.NArg() != 0 {
		return fmt.Errorf("unexpected argument %q", flag.Arg(0))
	}

	local, err := netip.ParseAddr(*address)
	if err != nil {
		return fmt.Errorf("--address: %v", err)
	}
	prefix, err := netip.ParsePrefix(*allowed)
	if err != nil {
		return fmt.Errorf("--allowed-ip: %v", err)
	}
	if _, err := netip.ParseAddrPort(*endpoint); err != nil {
		return fmt.Errorf("--endpoint: %v", err)
	}
	keyText, err := os.ReadFile(*keyFile)
	if err != nil {
		return fmt.Errorf("--private-key-file: %v", err)
	}
	privateHex, err := keyHex(string(keyText))
	if err != nil {
		return fmt.Errorf("--private-key-file: %v", err)
	}
	peerHex, err := keyHex(*peerKey)
	if err != nil {
		return fmt.Errorf("--peer-public-key: %v", err)
	}

	tun, tnet, err := netstack.CreateNetTUN([]netip.Addr{local}, nil, *mtu)
	if err != nil {
		return fmt.Errorf("netstack: %v", err)
	}
	dev := device.NewDevice(tun, conn.NewDefaultBind(), device.NewLogger(device.LogLevelError, "wireguard: "))
	defer dev.Close()
	config := fmt.Sprintf("private_key=%s\npublic_key=%s\nendpoint=%s\nallowed_ip=%s\n",
		privateHex, peerHex, *endpoint, prefix)
	if err := dev.IpcSet(config); err != nil {
		return fmt.Errorf("IpcSet: %v", err)
	}
	if err := dev.Up(); err != nil {
		return fmt.Errorf("device up: %v", err)
	}

	listener, err := net.Listen("tcp", *listen)
	if err != nil {
		return fmt.Errorf("--http: %v", err)
	}
	dial := func(ctx context.Context, target string) (net.Conn, error) {
		ctx, cancel := context.WithTimeout(ctx, dialTimeout)
		defer cancel()
		return tnet.DialContext(ctx, "tcp", target)
	}
	server := &http.Server{Handler: connectHandler{dial: dial}, ReadHeaderTimeout: 10 * time.Second}
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	served := make(chan error, 1)
	go func() { served <- server.Serve(listener) }()
	fmt.Fprintf(os.Stderr, "listening on %s\n", listener.Addr())
	select {
	case <-stop:
		listener.Close()
		return nil
	case err := <-served:
		return err
	}
}

// keyHex turns a base64 WireGuard key (as `wg genkey` writes it) into the hex IpcSet takes.
func keyHex(text string) (string, error) {
	key, err := base64.StdEncoding.DecodeString(strings.TrimSpace(text))
	if err != nil || len(key) != 32 {
		return "", errors.New("not a base64 WireGuard key")
	}
	return hex.EncodeToString(key), nil
}

type connectHandler struct {
	dial func(context.Context, string) (net.Conn, error)
}

// ServeHTTP answers CONNECT host:port: a connection through the tunnel, then the client's
// connection and it spliced until both directions have ended.
func (h connectHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodConnect {
		http.Error(w, "only CONNECT is served", http.StatusMethodNotAllowed)
		return
	}
	target, err := h.dial(r.Context(), r.Host)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	hijacker, ok := w.(http.Hijacker)
	if !ok {
		target.Close()
		http.Error(w, "cannot take over the connection", http.StatusInternalServerError)
		return
	}
	client, buffered, err := hijacker.Hijack()
	if err != nil {
		target.Close()
		return
	}
	defer client.Close()
	defer target.Close()
	if _, err := client.Write([]byte("HTTP/1.1 200 Connection established\r\n\r\n")); err != nil {
		return
	}
	// What the client sent after its request and the server's reader already took.
	if n := buffered.Reader.Buffered(); n > 0 {
		early, _ := buffered.Reader.Peek(n)
		if _, err := target.Write(early); err != nil {
			return
		}
	}
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		splice(target, client)
	}()
	go func() {
		defer wg.Done()
		splice(client, target)
	}()
	wg.Wait()
}

// splice copies src to dst until src ends, then ends dst's sending side, so that a half
// close passes through the proxy as it would through a direct connection.
func splice(dst, src net.Conn) {
	_, _ = io.Copy(dst, src)
	if half, ok := dst.(interface{ CloseWrite() error }); ok {
		_ = half.CloseWrite()
	} else {
		_ = dst.Close()
	}
}
