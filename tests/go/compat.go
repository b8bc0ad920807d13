// amqp091-go against a broker: `go run compat.go SCENARIO URL` prints one JSON line and exits 0,
// or prints the error and exits 1. Built in GOPATH mode against Debian's
// golang-github-rabbitmq-amqp091-go-dev (GOPATH=/usr/share/gocode GO111MODULE=off);
// run by tests/test_client_go.py.
package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

func must(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

func name(prefix string) string {
	return fmt.Sprintf("%s.go.%d.%d", prefix, os.Getpid(), time.Now().UnixNano())
}

func get(ch *amqp.Channel, q string) amqp.Delivery {
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		d, ok, err := ch.Get(q, true)
		must(err)
		if ok {
			return d
		}
		time.Sleep(20 * time.Millisecond)
	}
	must(errors.New("no message"))
	return amqp.Delivery{}
}

func main() {
	scenario, url := os.Args[1], os.Args[2]
	result := map[string]interface{}{}
	if scenario == "refused_login" {
		_, err := amqp.Dial(strings.Replace(url, "guest:guest@", "guest:wrong@", 1))
		result["refused"] = errors.Is(err, amqp.ErrCredentials) || (err != nil && strings.Contains(err.Error(), "403"))
		if err != nil {
			result["error"] = err.Error()
		}
		out, _ := json.Marshal(result)
		fmt.Println(string(out))
		return
	}
	conn, err := amqp.Dial(url)
	must(err)
	defer conn.Close()
	ch, err := conn.Channel()
	must(err)
	switch scenario {
	case "roundtrip":
		q, err := ch.QueueDeclare("", false, false, true, false, nil)
		must(err)
		must(ch.Publish("", q.Name, false, false, amqp.Publishing{ContentType: "text/plain", Body: []byte("hello")}))
		d := get(ch, q.Name)
		result["body"], result["content_type"] = string(d.Body), d.ContentType
	case "confirms":
		must(ch.Confirm(false))
		acks := ch.NotifyPublish(make(chan amqp.Confirmation, 100))
		q, err := ch.QueueDeclare("", false, false, true, false, nil)
		must(err)
		for i := 0; i < 20; i++ {
			must(ch.Publish("", q.Name, false, false, amqp.Publishing{Body: []byte("x")}))
		}
		acked := 0
		for i := 0; i < 20; i++ {
			if c := <-acks; c.Ack {
				acked++
			}
		}
		result["acked"] = acked
	case "cancel_notify", "queue_deleted_under_consumer":
		q := name("gocancel")
		_, err := ch.QueueDeclare(q, false, false, false, false, nil)
		must(err)
		cancels := ch.NotifyCancel(make(chan string, 1))
		_, err = ch.Consume(q, "go-consumer", true, false, false, false, nil)
		must(err)
		if scenario == "cancel_notify" {
			other, err := conn.Channel()
			must(err)
			_, err = other.QueueDelete(q, false, false, false)
			must(err)
		} else {
			n, err := ch.QueueDelete(q, false, false, false)
			must(err)
			result["deleted"] = n
		}
		select {
		case tag := <-cancels:
			result["cancelled"] = tag
		case <-time.After(10 * time.Second):
			must(errors.New("no basic.cancel"))
		}
	case "large":
		q, err := ch.QueueDeclare("", false, false, true, false, nil)
		must(err)
		body := bytes.Repeat([]byte("L"), 3*131072+17)
		must(ch.Publish("", q.Name, false, false, amqp.Publishing{Body: body}))
		d := get(ch, q.Name)
		result["size"], result["same"] = len(d.Body), bytes.Equal(d.Body, body)
	case "exception_with_close":
		// TestChannelExceptionWithCloseIssue43: a publish to a missing exchange, then Close(); the
		// server's channel.close 404 and the client's cross (or not: each round takes its chance).
		// The connection and its other channel `ch` must be unaffected.
		rounds, still := 100, name("still-here")
		for i := 0; i < rounds; i++ {
			c1, err := conn.Channel()
			must(err)
			must(c1.Publish(name("missing"), "", false, false, amqp.Publishing{}))
			c1.Close()
			must(ch.ExchangeDeclare(still, "direct", false, true, false, false, nil))
		}
		result["rounds"] = rounds
	default:
		must(fmt.Errorf("unknown scenario %s", scenario))
	}
	out, _ := json.Marshal(result)
	fmt.Println(string(out))
}
