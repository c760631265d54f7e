// Command netstack-client is the wireguard-go netstack row of `cargo xtask bench-embedded`:
// the embedded-stack client contract (see xtask/src/embedded_bench.rs) implemented with
// wireguard-go's device and gVisor's TCP/IP stack in this process (tun/netstack), so no TUN
// and no root. Its UDP socket is opened in whatever network namespace it is started in.
//
//	netstack-client --address 10.77.0.1 --peer-addr 10.77.0.2 --sink-port 5301 \
//	    --echo-port 5302 --private-key-file KEY --peer-public-key BASE64 \
//	    --endpoint 192.0.2.2:51820 [--mtu 1420] (bulk SECONDS | rr CONNS ROUNDS)
//
// It prints one JSON line on stdout and exits 0, or one line on stderr and exits 1.
package main

import (
	"context"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.zx2c4.com/wireguard/conn"
	"golang.zx2c4.com/wireguard/device"
	"golang.zx2c4.com/wireguard/tun/netstack"
)

const (
	// Bytes per request in rr mode, echoed back whole.
	messageBytes = 64
	// Longest a connect (with the first handshake) or one round trip may take.
	ioTimeout = 10 * time.Second
	// Longest an rr run may take in all.
	rrLimit = 60 * time.Second
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintf(os.Stderr, "netstack-client: %v\n", err)
		os.Exit(1)
	}
}

func run() error {
	address := flag.String("address", "", "this side's tunnel address")
	peerAddr := flag.String("peer-addr", "", "the far side's tunnel address")
	sinkPort := flag.Int("sink-port", 0, "the far side's TCP sink port (bulk)")
	echoPort := flag.Int("echo-port", 0, "the far side's TCP echo port (rr)")
	keyFile := flag.String("private-key-file", "", "this side's private key, base64")
	peerKey := flag.String("peer-public-key", "", "the far side's public key, base64")
	endpoint := flag.String("endpoint", "", "the far side's WireGuard endpoint, IP:port")
	mtu := flag.Int("mtu", 1420, "the tunnel MTU")
	flag.Parse()

	local, err := netip.ParseAddr(*address)
	if err != nil {
		return fmt.Errorf("--address: %v", err)
	}
	peer, err := netip.ParseAddr(*peerAddr)
	if err != nil {
		return fmt.Errorf("--peer-addr: %v", err)
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
	args := flag.Args()

	tun, tnet, err := netstack.CreateNetTUN([]netip.Addr{local}, nil, *mtu)
	if err != nil {
		return fmt.Errorf("netstack: %v", err)
	}
	dev := device.NewDevice(tun, conn.NewDefaultBind(), device.NewLogger(device.LogLevelError, "wireguard: "))
	defer dev.Close()
	bits := 32
	if peer.Is6() {
		bits = 128
	}
	config := fmt.Sprintf("private_key=%s\npublic_key=%s\nendpoint=%s\nallowed_ip=%s/%d\n",
		privateHex, peerHex, *endpoint, peer, bits)
	if err := dev.IpcSet(config); err != nil {
		return fmt.Errorf("IpcSet: %v", err)
	}
	if err := dev.Up(); err != nil {
		return fmt.Errorf("device up: %v", err)
	}
	dial := func(port int) (net.Conn, error) {
		ctx, cancel := context.WithTimeout(context.Background(), ioTimeout)
		defer cancel()
		return tnet.DialContext(ctx, "tcp", netip.AddrPortFrom(peer, uint16(port)).String())
	}

	var result any
	switch {
	case len(args) == 2 && args[0] == "bulk":
		seconds, err := strconv.ParseFloat(args[1], 64)
		if err != nil || seconds <= 0 || seconds > 3600 {
			return fmt.Errorf("bulk takes a number of seconds, not %q", args[1])
		}
		result, err = bulk(dial, *sinkPort, time.Duration(seconds*float64(time.Second)))
		if err != nil {
			return err
		}
	case len(args) == 3 && args[0] == "rr":
		conns, err1 := strconv.Atoi(args[1])
		rounds, err2 := strconv.Atoi(args[2])
		if err1 != nil || err2 != nil || conns <= 0 || conns > 4096 || rounds < conns {
			return fmt.Errorf("rr takes CONNS ROUNDS (0 < CONNS <= ROUNDS), not %q %q", args[1], args[2])
		}
		result, err = rr(dial, *echoPort, conns, rounds)
		if err != nil {
			return err
		}
	default:
		return errors.New("the mode is `bulk SECONDS` or `rr CONNS ROUNDS`")
	}
	line, err := json.Marshal(result)
	if err != nil {
		return err
	}
	fmt.Println(string(line))
	return nil
}

// keyHex turns a base64 WireGuard key (as `wg genkey` writes it) into the hex IpcSet takes.
func keyHex(text string) (string, error) {
	key, err := base64.StdEncoding.DecodeString(strings.TrimSpace(text))
	if err != nil || len(key) != 32 {
		return "", errors.New("not a base64 WireGuard key")
	}
	return hex.EncodeToString(key), nil
}

type bulkResult struct {
	Mode    string  `json:"mode"`
	Bytes   uint64  `json:"bytes"`
	Seconds float64 `json:"seconds"`
}

// bulk sends as fast as it can on one connection for `length`, then closes it and waits
// until the sink has read everything.
func bulk(dial func(int) (net.Conn, error), port int, length time.Duration) (bulkResult, error) {
	c, err := dial(port)
	if err != nil {
		return bulkResult{}, fmt.Errorf("connect to the sink: %v", err)
	}
	defer c.Close()
	buf := make([]byte, 128*1024)
	start := time.Now()
	end := start.Add(length)
	var sent uint64
	for time.Now().Before(end) {
		// A write that cannot go on for ioTimeout means the path is stuck.
		if err := c.SetWriteDeadline(time.Now().Add(ioTimeout)); err != nil {
			return bulkResult{}, err
		}
		n, err := c.Write(buf)
		sent += uint64(n)
		if err != nil {
			return bulkResult{}, fmt.Errorf("write after %d bytes: %v", sent, err)
		}
	}
	seconds := time.Since(start).Seconds()
	// Every byte written is delivered before the process exits (its stack goes with it):
	// close the sending side, then wait for the sink to close its own, which it does once it
	// has read to the end.
	half, ok := c.(interface{ CloseWrite() error })
	if !ok {
		return bulkResult{}, errors.New("the connection cannot close one side")
	}
	if err := half.CloseWrite(); err != nil {
		return bulkResult{}, fmt.Errorf("close: %v", err)
	}
	if err := c.SetReadDeadline(time.Now().Add(ioTimeout)); err != nil {
		return bulkResult{}, err
	}
	if _, err := io.Copy(io.Discard, c); err != nil {
		return bulkResult{}, fmt.Errorf("waiting for the sink to close: %v", err)
	}
	return bulkResult{Mode: "bulk", Bytes: sent, Seconds: seconds}, nil
}

type rrResult struct {
	Mode              string  `json:"mode"`
	Conns             int     `json:"conns"`
	Requests          int     `json:"requests"`
	Seconds           float64 `json:"seconds"`
	RequestsPerSecond float64 `json:"requests_per_second"`
	P50us             float64 `json:"p50_us"`
	P99us             float64 `json:"p99_us"`
}

// rr opens `conns` connections to the echo server, checks one round trip on each, then
// keeps one 64-byte request in flight on every connection until `rounds` round trips have
// completed in all (or rrLimit passes, which is an error).
func rr(dial func(int) (net.Conn, error), port, conns, rounds int) (rrResult, error) {
	sockets := make([]net.Conn, 0, conns)
	defer func() {
		for _, c := range sockets {
			c.Close()
		}
	}()
	for i := 0; i < conns; i++ {
		c, err := dial(port)
		if err != nil {
			return rrResult{}, fmt.Errorf("connection %d: connect to the echo server: %v", i, err)
		}
		sockets = append(sockets, c)
	}
	for i, c := range sockets {
		if err := roundTrip(c, request(uint64(i)), time.Now().Add(ioTimeout)); err != nil {
			return rrResult{}, fmt.Errorf("connection %d, warm-up: %v", i, err)
		}
	}

	var tickets atomic.Int64
	var wg sync.WaitGroup
	samples := make([][]float64, conns)
	errs := make([]error, conns)
	deadline := time.Now().Add(rrLimit)
	start := time.Now()
	for i, c := range sockets {
		wg.Add(1)
		go func(i int, c net.Conn) {
			defer wg.Done()
			for {
				n := tickets.Add(1)
				if n > int64(rounds) {
					return
				}
				if time.Now().After(deadline) {
					errs[i] = fmt.Errorf("not done within %v", rrLimit)
					return
				}
				sent := time.Now()
				limit := sent.Add(ioTimeout)
				if limit.After(deadline) {
					limit = deadline
				}
				if err := roundTrip(c, request(uint64(n)), limit); err != nil {
					errs[i] = fmt.Errorf("connection %d: %v", i, err)
					return
				}
				samples[i] = append(samples[i], float64(time.Since(sent).Nanoseconds())/1e3)
			}
		}(i, c)
	}
	wg.Wait()
	seconds := time.Since(start).Seconds()
	if err := errors.Join(errs...); err != nil {
		return rrResult{}, err
	}
	var all []float64
	for _, s := range samples {
		all = append(all, s...)
	}
	sort.Float64s(all)
	return rrResult{
		Mode:              "rr",
		Conns:             conns,
		Requests:          len(all),
		Seconds:           seconds,
		RequestsPerSecond: float64(len(all)) / seconds,
		P50us:             percentile(all, 0.50),
		P99us:             percentile(all, 0.99),
	}, nil
}

func request(n uint64) []byte {
	r := make([]byte, messageBytes)
	for i := range r {
		r[i] = 0x5a
	}
	for i := 0; i < 8; i++ {
		r[i] = byte(n >> (56 - 8*i))
	}
	return r
}

// roundTrip sends one request and checks that the echo comes back whole and unchanged.
func roundTrip(c net.Conn, req []byte, deadline time.Time) error {
	if err := c.SetDeadline(deadline); err != nil {
		return err
	}
	if _, err := c.Write(req); err != nil {
		return fmt.Errorf("write: %v", err)
	}
	reply := make([]byte, len(req))
	if _, err := io.ReadFull(c, reply); err != nil {
		return fmt.Errorf("read: %v", err)
	}
	if string(reply) != string(req) {
		return errors.New("the echo differs from the request")
	}
	return nil
}

// percentile is the nearest-rank value at quantile q of sorted samples: index round((n-1)q).
func percentile(sorted []float64, q float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	i := int(float64(len(sorted)-1)*q + 0.5)
	return sorted[i]
}
